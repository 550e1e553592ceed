"""/proc and /sys recon, the process's own privileges, the PID namespace and PID 1."""

from __future__ import annotations

import json
import subprocess

import pytest

from boxyd.stage2 import landlock
from tests.conftest import Boxy
from tests.escape.conftest import alive, assert_contained, describe, run_py

pytestmark = pytest.mark.sandbox


def test_kcore_unreadable(boxy: Boxy) -> None:
    r = run_py(
        boxy,
        """
data = read("kcore", "/proc/kcore", 4096)
if data:
    escaped("kcore", f"{len(data)} bytes of kernel memory")
""",
    )
    got = assert_contained(r, "kcore")
    assert got["kcore"] in ("read:0", "EACCES", "EPERM", "ENOENT"), describe(r)


def test_kallsyms_has_no_addresses(boxy: Boxy) -> None:
    r = run_py(
        boxy,
        """
data = read("kallsyms", "/proc/kallsyms", 1 << 22) or b""
lines = data.splitlines()
real = [ln for ln in lines if ln.split(b" ", 1)[0].strip(b"0")]
tried("kallsyms-lines", f"{len(lines)}:{len(real)}")
if real:
    escaped("kallsyms", f"symbol addresses: {real[:2]!r}")
""",
    )
    assert_contained(r, "kallsyms", "kallsyms-lines")


def test_sysrq_trigger_not_writable(boxy: Boxy) -> None:
    # opened for writing only: nothing is ever written to it
    r = run_py(
        boxy,
        """
try:
    fd = os.open("/proc/sysrq-trigger", os.O_WRONLY)
except OSError as e:
    tried("sysrq", ename(e))
else:
    os.close(fd)
    escaped("sysrq", "/proc/sysrq-trigger opened for writing")
""",
    )
    assert_contained(r, "sysrq")


@pytest.mark.parametrize(
    "name", ["timer_list", "sched_debug", "keys", "key-users", "kmsg", "iomem"]
)
def test_recon_files_masked(boxy: Boxy, name: str) -> None:
    r = run_py(
        boxy,
        """
path = "/proc/" + sys.argv[1]
try:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
except OSError as e:
    tried("masked", ename(e))
else:
    try:
        data = os.read(fd, 4096)
    except OSError as e:
        tried("masked", ename(e))
    else:
        tried("masked", f"read:{len(data)}")
        if data:
            escaped("masked", f"{path}: {data[:60]!r}")
""",
        args=(name,),
    )
    got = assert_contained(r, "masked")
    assert got["masked"] in ("read:0", "ENOENT", "EACCES", "EPERM"), describe(r)


def test_sys_absent(boxy: Boxy) -> None:
    r = run_py(
        boxy,
        """
for label, p in (("sys", "/sys"), ("sys-net", "/sys/class/net"), ("sys-kernel", "/sys/kernel"),
                 ("sys-cgroup", "/sys/fs/cgroup")):
    try:
        names = os.listdir(p)
    except OSError as e:
        tried(label, ename(e))
    else:
        tried(label, f"entries:{len(names)}")
        if names:
            escaped(label, f"{p}: {names[:5]}")
""",
    )
    assert_contained(r, "sys", "sys-net", "sys-kernel", "sys-cgroup", results={"sys": {"ENOENT"}})


def test_own_privileges_dropped(boxy: Boxy) -> None:
    r = run_py(
        boxy,
        """
import json
fields = {}
with open("/proc/self/status") as f:
    for line in f:
        k, _, v = line.partition(":")
        fields[k] = v.strip()
want = {"NoNewPrivs": "1", "Seccomp": "2", "CapEff": "0" * 16, "CapPrm": "0" * 16,
        "CapBnd": "0" * 16, "CapAmb": "0" * 16, "CapInh": "0" * 16}
for k, v in want.items():
    tried(k, fields.get(k, "missing"))
    if fields.get(k) != v:
        escaped(k, f"{fields.get(k)!r} != {v!r}")
""",
    )
    keys = ("NoNewPrivs", "Seccomp", "CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh")
    got = assert_contained(r, *keys)
    assert all(got[k] != "missing" for k in keys), describe(r)


PIDS_PAYLOAD = """
import json
host = sys.argv[1]
pids = sorted(int(n) for n in os.listdir("/proc") if n.isdigit())
tried("pids", json.dumps({"pids": pids, "me": os.getpid()}))
if os.path.exists(f"/proc/{host}"):
    escaped("host-pid", f"/proc/{host} is visible")
try:
    os.kill(int(host), 0)
except OSError as e:
    tried("host-pid", ename(e))
else:
    escaped("host-pid", f"pid {host} can be signalled")
with open("/proc/1/cmdline", "rb") as f:
    tried("pid1", f.read().split(b"\\0")[0].decode() or "-")
"""


def test_pid_namespace_shows_only_sandbox(
    boxy: Boxy, host_sleeper: subprocess.Popen[bytes]
) -> None:
    r = run_py(boxy, PIDS_PAYLOAD, args=(str(host_sleeper.pid),))
    got = assert_contained(r, "pids", "host-pid", "pid1", results={"host-pid": {"ESRCH"}})
    seen = json.loads(got["pids"])
    # PID 1 (boxy's init) and the payload; nothing of the host, not even the outer stage 2
    assert seen["pids"] == sorted({1, seen["me"]}), describe(r)
    assert alive(host_sleeper.pid)


def test_ps_shows_only_sandbox(boxy: Boxy, host_sleeper: subprocess.Popen[bytes]) -> None:
    """The same through the tools a payload would use (ps if installed, ls /proc)."""
    r = boxy.sh(
        "echo TRIED ls $(ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '); "
        "command -v ps >/dev/null && echo TRIED ps $(ps -e -o pid= | tr '\\n' ' '); "
        f"ls -d /proc/{host_sleeper.pid} 2>/dev/null && echo ESCAPED host pid; true"
    )
    assert "ESCAPED" not in r.stdout.decode(), describe(r)
    assert r.returncode == 0, describe(r)
    for line in r.stdout.decode().splitlines():
        kind, _, pids = line.removeprefix("TRIED ").partition(" ")
        assert str(host_sleeper.pid) not in pids.split(), describe(r)
        assert "1" in pids.split(), describe(r)  # the listing is real
    assert b"TRIED ls" in r.stdout, describe(r)


def test_kill_all_does_not_reach_host(boxy: Boxy, host_sleeper: subprocess.Popen[bytes]) -> None:
    pid = host_sleeper.pid
    # the shell is the payload itself: kill(-1) spares only its caller (and PID 1)
    r = boxy.sh(
        "sleep 100 & inner=$!; "
        "kill -9 -1; echo TRIED kill-all rc=$?; "
        "wait $inner; echo TRIED inner-sleep status=$?; "  # positive: it really signalled
        f"if kill -9 {pid} 2>/dev/null; then echo ESCAPED kill-host; else echo TRIED kill-host; fi; "
        "exit 7"
    )
    assert "ESCAPED" not in r.stdout.decode(), describe(r)
    assert r.returncode == 7, describe(r)  # the run still reports the payload's status
    assert b"TRIED kill-all rc=0" in r.stdout and b"TRIED inner-sleep status=137" in r.stdout, (
        describe(r)
    )
    assert b"TRIED kill-host" in r.stdout, describe(r)
    assert alive(pid), "kill -9 -1 inside the sandbox killed a host process of the user"
    assert host_sleeper.poll() is None
    # and the daemon survived to serve the next run
    r2 = boxy.sh("echo TRIED alive")
    assert r2.returncode == 0 and b"TRIED alive" in r2.stdout, describe(r2)


def test_pid1_is_not_dumpable(boxy: Boxy) -> None:
    r = run_py(
        boxy,
        """
for label, p in (("environ", "/proc/1/environ"), ("mem", "/proc/1/mem"), ("maps", "/proc/1/maps"),
                 ("auxv", "/proc/1/auxv")):
    data = read(label, p)
    if data:
        escaped(label, f"{len(data)} bytes of PID 1's {label}")
for label, p in (("fd", "/proc/1/fd"), ("map_files", "/proc/1/map_files")):
    try:
        names = os.listdir(p)
    except OSError as e:
        tried(label, ename(e))
    else:
        escaped(label, f"PID 1's {label}: {names}")
for n in range(0, 8):
    try:
        fd = os.open(f"/proc/1/fd/{n}", os.O_RDONLY)
    except OSError as e:
        tried(f"fd{n}", ename(e))
    else:
        os.close(fd)
        escaped(f"fd{n}", f"opened PID 1's fd {n}")
""",
    )
    labels = ("environ", "mem", "maps", "auxv", "fd", "map_files", *(f"fd{n}" for n in range(8)))
    got = assert_contained(r, *labels)
    assert got["environ"] == "EACCES" and got["mem"] == "EACCES" and got["fd"] == "EACCES", (
        describe(r)
    )


def test_pid1_is_confined_in_a_landlock_domain_of_its_own(boxy: Boxy) -> None:
    # PID 1 keeps every layer the payload has (docs/design.md, steps 7-9); its Landlock
    # domain is not the payload's (the payload's process confines itself), so with
    # Landlock's signal scope (ABI 6) the payload cannot make PID 1 act at all: not
    # even a signal for it to forward. One domain for both let kill(1, 0) succeed.
    r = run_py(
        boxy,
        """
text = (read("status", "/proc/1/status") or b"").decode()
fields = dict(ln.split(":", 1) for ln in text.splitlines() if ":" in ln)
tried("layers", ",".join(fields.get(k, "-").strip() for k in ("CapEff", "NoNewPrivs", "Seccomp")))
try:
    os.kill(1, 0)
except OSError as e:
    tried("signal", ename(e))
else:
    tried("signal", "OK")
""",
    )
    got = assert_contained(r, "layers", "signal")
    assert got["layers"] == "0000000000000000,1,2", describe(r)
    if landlock.abi_version() >= 6:
        assert got["signal"] == "EPERM", describe(r)


def test_no_leaked_file_descriptors(boxy: Boxy) -> None:
    """An inherited fd to a host directory or to boxyd's socket would be a way out
    (openat(fd, "..") or a Run with weaker flags): only stdio may be open."""
    r = run_py(
        boxy,
        """
def is_open(fd):
    try:
        os.fstat(fd)
    except OSError:
        return False  # the directory listing's own fd, closed by now
    return True
fds = [fd for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")) if is_open(fd)]
tried("fds", ",".join(map(str, fds)))
for fd in fds:
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError as e:
        target = ename(e)
    tried(f"fd{fd}", target)
    if fd > 2:
        escaped(f"fd{fd}", f"inherited fd {fd} -> {target}")
""",
    )
    got = assert_contained(r, "fds", "fd0", "fd1", "fd2")
    assert got["fds"] == "0,1,2", describe(r)


@pytest.mark.parametrize(
    "path",
    [
        "kernel/core_pattern",  # a pipe here runs a program as root on the host at the next crash
        "kernel/modprobe",
        "kernel/hotplug",
        "vm/drop_caches",
        "user/max_user_namespaces",  # the sandbox's own, set to 0 before caps were dropped
    ],
    ids=lambda p: p.replace("/", "."),
)
def test_proc_sys_not_writable(boxy: Boxy, path: str) -> None:
    # opened for writing only: nothing is ever written
    r = run_py(
        boxy,
        """
path = "/proc/sys/" + sys.argv[1]
try:
    fd = os.open(path, os.O_WRONLY)
except OSError as e:
    tried("open-write", ename(e))
else:
    os.close(fd)
    escaped("open-write", f"{path} opened for writing")
""",
        args=(path,),
    )
    assert_contained(r, "open-write")


def test_pid1_names_no_host_path(boxy: Boxy) -> None:
    # PID 1 is boxy's interpreter: its argv would name the venv (often under $HOME).
    r = run_py(
        boxy,
        """
cmdline = read("cmdline", "/proc/1/cmdline", 65536) or b""
comm = read("comm", "/proc/1/comm", 256) or b""
tried("pid1", cmdline.rstrip(b"\\0").decode(errors="replace") + "|" + comm.strip().decode())
if b"/" in cmdline or b"python" in cmdline or b"boxyd" in cmdline:
    escaped("pid1-cmdline", cmdline[:200])
""",
    )
    got = assert_contained(r, "pid1")
    assert got["pid1"] == "boxy-init|boxy-init", describe(r)
