"""A small classic-BPF interpreter for seccomp filters, so tests can run the exact
bytes stage 2 loads and assert a verdict without touching the kernel.

It follows the kernel's seccomp dialect: the packet is `struct seccomp_data`
(little endian), loads are 32-bit aligned absolute words, the scratch memory
has 16 words, and anything the kernel's checker would refuse raises BPFError.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; }
SECCOMP_DATA_SIZE = 64
BPF_MAXINSNS = 4096
BPF_MEMWORDS = 16

# seccomp return actions (include/uapi/linux/seccomp.h)
RET_KILL_PROCESS = 0x80000000
RET_KILL_THREAD = 0x00000000
RET_TRAP = 0x00030000
RET_ERRNO = 0x00050000
RET_USER_NOTIF = 0x7FC00000
RET_TRACE = 0x7FF00000
RET_LOG = 0x7FFC0000
RET_ALLOW = 0x7FFF0000
RET_ACTION_FULL = 0xFFFF0000
RET_DATA = 0x0000FFFF

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000

# instruction classes and fields (include/uapi/linux/bpf_common.h)
_LD, _LDX, _ST, _STX, _ALU, _JMP, _RET, _MISC = range(8)
_W, _ABS, _IMM, _MEM, _LEN = 0x00, 0x20, 0x00, 0x60, 0x80
_K, _X, _A = 0x00, 0x08, 0x10
_JA, _JEQ, _JGT, _JGE, _JSET = 0x00, 0x10, 0x20, 0x30, 0x40
_TAX, _TXA = 0x00, 0x80
_U32 = 0xFFFFFFFF


class BPFError(Exception):
    """The program would be refused by the kernel or ran off its end."""


@dataclass(frozen=True)
class Insn:
    code: int
    jt: int
    jf: int
    k: int


def parse(bpf: bytes) -> list[Insn]:
    """Split raw `struct sock_filter` bytes (u16 code, u8 jt, u8 jf, u32 k) into instructions."""
    if not bpf or len(bpf) % 8:
        raise BPFError(f"program length {len(bpf)} is not a positive multiple of 8")
    if len(bpf) // 8 > BPF_MAXINSNS:
        raise BPFError(f"program has {len(bpf) // 8} instructions (max {BPF_MAXINSNS})")
    return [Insn(*struct.unpack_from("<HBBI", bpf, off)) for off in range(0, len(bpf), 8)]


def seccomp_data(
    nr: int, arch: int = AUDIT_ARCH_X86_64, args: tuple[int, ...] = (), ip: int = 0
) -> bytes:
    """Pack a `struct seccomp_data`; args are taken modulo 2**64 (negative ints allowed)."""
    full = [a & 0xFFFFFFFFFFFFFFFF for a in args] + [0] * (6 - len(args))
    if len(full) != 6:
        raise ValueError("at most 6 arguments")
    return struct.pack("<iIQ6Q", nr, arch, ip, *full)


def run(prog: list[Insn], data: bytes) -> int:
    """Run the program over one seccomp_data packet; returns the 32-bit return value."""
    if len(data) != SECCOMP_DATA_SIZE:
        raise BPFError("seccomp_data must be 64 bytes")
    a = x = 0
    mem = [0] * BPF_MEMWORDS
    pc = 0
    # every jump goes forward, so the number of steps is bounded by the length
    while pc < len(prog):
        ins = prog[pc]
        cls, code, k = ins.code & 0x07, ins.code, ins.k
        pc += 1
        if cls in (_LD, _LDX):
            mode = code & 0xE0
            if cls == _LD and code & 0x18 != _W:
                raise BPFError(f"pc {pc - 1}: only word loads are allowed in seccomp")
            if mode == _ABS and cls == _LD:
                if k % 4 or k + 4 > SECCOMP_DATA_SIZE:
                    raise BPFError(f"pc {pc - 1}: bad absolute load offset {k}")
                val = struct.unpack_from("<I", data, k)[0]
            elif mode == _IMM:
                val = k
            elif mode == _MEM:
                if k >= BPF_MEMWORDS:
                    raise BPFError(f"pc {pc - 1}: bad scratch slot {k}")
                val = mem[k]
            elif mode == _LEN:
                val = SECCOMP_DATA_SIZE
            else:
                raise BPFError(f"pc {pc - 1}: unsupported load {code:#x}")
            if cls == _LD:
                a = val
            else:
                x = val
        elif cls in (_ST, _STX):
            if k >= BPF_MEMWORDS:
                raise BPFError(f"pc {pc - 1}: bad scratch slot {k}")
            mem[k] = a if cls == _ST else x
        elif cls == _ALU:
            a = _alu(code, a, x if code & _X else k, pc - 1)
        elif cls == _JMP:
            op = code & 0xF0
            if op == _JA:
                pc += k
            else:
                src = x if code & _X else k
                if op == _JEQ:
                    taken = a == src
                elif op == _JGT:
                    taken = a > src
                elif op == _JGE:
                    taken = a >= src
                elif op == _JSET:
                    taken = bool(a & src)
                else:
                    raise BPFError(f"pc {pc - 1}: unsupported jump {code:#x}")
                pc += ins.jt if taken else ins.jf
        elif cls == _RET:
            src = code & 0x18
            if src == _K:
                return k
            if src == _A:
                return a
            raise BPFError(f"pc {pc - 1}: unsupported return {code:#x}")
        elif cls == _MISC:
            if code & 0xF8 == _TAX:
                x = a
            elif code & 0xF8 == _TXA:
                a = x
            else:
                raise BPFError(f"pc {pc - 1}: unsupported misc {code:#x}")
        else:  # pragma: no cover - cls is 3 bits
            raise BPFError(f"pc {pc - 1}: bad class {cls}")
    raise BPFError("ran off the end of the program without a return")


def _alu(code: int, a: int, src: int, pc: int) -> int:
    op = code & 0xF0
    if op == 0x00:
        r = a + src
    elif op == 0x10:
        r = a - src
    elif op == 0x20:
        r = a * src
    elif op == 0x30:
        if src == 0:
            raise BPFError(f"pc {pc}: division by zero")
        r = a // src
    elif op == 0x40:
        r = a | src
    elif op == 0x50:
        r = a & src
    elif op == 0x60:
        r = a << (src & 31)
    elif op == 0x70:
        r = a >> (src & 31)
    elif op == 0x80:
        r = -a
    elif op == 0x90:
        if src == 0:
            raise BPFError(f"pc {pc}: modulo by zero")
        r = a % src
    elif op == 0xA0:
        r = a ^ src
    else:
        raise BPFError(f"pc {pc}: unsupported alu {code:#x}")
    return r & _U32


class Filter:
    """A parsed program with a convenience entry point per syscall."""

    def __init__(self, bpf: bytes) -> None:
        self.prog = parse(bpf)

    def __call__(self, nr: int, *args: int, arch: int = AUDIT_ARCH_X86_64) -> int:
        return run(self.prog, seccomp_data(nr, arch, args))


def action(ret: int) -> int:
    """The action part of a return value (the kernel compares on the full action mask)."""
    return ret & RET_ACTION_FULL


def errno_of(ret: int) -> int | None:
    """The errno of an ERRNO verdict, else None."""
    return ret & RET_DATA if action(ret) == RET_ERRNO else None


def describe(ret: int) -> str:
    """A readable verdict for assertion messages: ALLOW, KILL_PROCESS, ERRNO(1), …"""
    names = {
        RET_KILL_PROCESS: "KILL_PROCESS",
        RET_KILL_THREAD: "KILL_THREAD",
        RET_TRAP: "TRAP",
        RET_USER_NOTIF: "USER_NOTIF",
        RET_LOG: "LOG",
        RET_ALLOW: "ALLOW",
    }
    act = action(ret)
    if act == RET_ERRNO:
        return f"ERRNO({ret & RET_DATA})"
    if act == RET_TRACE:
        return f"TRACE({ret & RET_DATA})"
    return names.get(act, f"UNKNOWN({ret:#x})")
