#!/usr/bin/env python3
"""What a paused lookup costs the other connections (issue 34, `--ask`): lookups and
connections of a session with a question open on its terminal, and of another
session, against the same with no question open, in one run, in a test internet of
its own (bench/net.py's, under the prefix ``boxyq``).

Four sessions run with ``--ask`` on terminals of their own (the questions are held
open: nobody answers until the phase is measured), a fifth without. Each round has
a quiet phase (no question open) and an open one (each asking session has looked up
a name not on its allowlist, which its DNS proxy pauses while the question waits on
its terminal: 4 open at once, asking.MAX_OPEN; denied after the phase), in turn
first, after one warm-up phase. In each phase the first asking session and the
fifth measure:

- lookups: ``--lookups`` resolutions of the allowed name (paced under boxy's DNS
  rate), median ms;
- connections: ``--conns`` sequential short HTTP requests by address, per second.

Figures: the median over rounds of open ÷ quiet for each (1.0 is "nothing
measurable"). A question is counted
open only if its lookup is still waiting after the open phase. Also said: how many
of four names looked up at once in one session are asked at the same time (one
terminal takes one question at a time: pty.PtyRelay.ask).

Run as root: ``.venv/bin/python bench/ask.py [--rounds 3] [--json]``. Nothing here
leaves the machine: every address is inside the bench's own netns.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, cast

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.net import BIN, PORT, PYTHON, BenchError, Env, internet, main_as_root  # noqa: E402
from bench.table import INFORMATION, Figure, at_least, at_most, emit  # noqa: E402
from boxyd.daemon.asking import MAX_OPEN  # noqa: E402
from boxyd.net.dnsproxy import RATE as DNS_RATE  # noqa: E402
from tests.harness.fakenet import plan  # noqa: E402

PREFIX = "boxyq"
STATE = Path("/run/boxyq")
PACE = 1.5 / DNS_RATE  # seconds between timed lookups: under a session's DNS rate
WAIT = 30.0  # seconds for any one step (a prompt to show, a client to answer)

# The client, stdlib only, in each sandbox: commands in from the FIFO ctl.LABEL, one
# JSON answer per command out to out.LABEL (an asking session's stdin is its terminal,
# whose keys go to the question while one is open).
CLIENT = r"""
import json, socket, statistics, sys, threading, time
label, name, addr, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
waiting = {}  # names looked up and not answered yet -> thread

def lookup(host):
    try:
        socket.getaddrinfo(host, 443, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        pass

def ask(hosts):
    for h in hosts.split(","):
        waiting[h] = threading.Thread(target=lookup, args=(h,), daemon=True)
        waiting[h].start()
    return {"asked": len(hosts.split(","))}

def held(_):
    return {"waiting": sorted(h for h, t in waiting.items() if t.is_alive())}

def join(seconds):
    end = time.monotonic() + float(seconds)
    for h, t in list(waiting.items()):
        t.join(max(0.0, end - time.monotonic()))
        if not t.is_alive():
            del waiting[h]
    return held("")

def lookups(arg):
    n, pace = arg.split(",")
    ms = []
    for _ in range(int(n)):
        time.sleep(float(pace))
        t0 = time.perf_counter()
        socket.getaddrinfo(name, port, socket.AF_INET, socket.SOCK_STREAM)
        ms.append((time.perf_counter() - t0) * 1000)
    return {"median_ms": statistics.median(ms), "p90_ms": sorted(ms)[int(len(ms) * 0.9)]}

def conns(n):
    ok, t0 = 0, time.perf_counter()
    for _ in range(int(n)):
        with socket.create_connection((addr, port), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % name.encode())
            ok += s.recv(64).startswith(b"HTTP/1.1 200")
            while s.recv(65536):
                pass
    return {"ok": ok, "per_s": ok / (time.perf_counter() - t0)}

with open(f"ctl.{label}") as ctl, open(f"out.{label}", "w") as out:
    for line in ctl:
        cmd, _, arg = line.strip().partition(" ")
        fn = {"ask": ask, "held": held, "join": join, "lookups": lookups, "conns": conns}[cmd]
        out.write(json.dumps(fn(arg)) + "\n")
        out.flush()
"""


@dataclass
class Session:
    """One sandboxed client: its boxyctl, its FIFOs, its terminal (asking ones)."""

    label: str
    proc: subprocess.Popen[bytes]
    ctl: TextIO
    out: TextIO
    master: int = -1
    said: bytearray = field(default_factory=bytearray)

    def call(self, cmd: str, arg: object = "") -> dict[str, Any]:
        self.ctl.write(f"{cmd} {arg}\n")
        self.ctl.flush()
        line = self.out.readline()
        if not line:
            raise BenchError(f"{self.label}: no answer to {cmd} (exit {self.proc.poll()})")
        return cast(dict[str, Any], json.loads(line))

    def read_terminal(self) -> None:
        """A thread: the terminal's output, kept (and never left to fill up)."""
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.said += data

    def wait_for(self, text: str) -> None:
        end = time.monotonic() + WAIT
        while text.encode() not in self.said:
            if time.monotonic() > end or self.proc.poll() is not None:
                raise BenchError(f"{self.label}: no {text!r} on its terminal: {bytes(self.said)!r}")
            time.sleep(0.01)

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)


def _fifos(work: Path, label: str, env: Env) -> None:
    for kind in ("ctl", "out"):
        os.mkfifo(work / f"{kind}.{label}", 0o600)
        os.chown(work / f"{kind}.{label}", env.pw.pw_uid, env.pw.pw_gid)


def _open_timed(path: Path, mode: str) -> TextIO:
    """PATH (a FIFO) opened once its other end is, within WAIT: a client that did not
    start fails the bench instead of hanging it."""
    got: list[TextIO] = []
    t = threading.Thread(
        target=lambda: got.append(cast(TextIO, open(path, mode))),  # noqa: SIM115
        daemon=True,
    )
    t.start()
    t.join(WAIT)
    if not got:
        raise BenchError(f"{path.name}: the client never opened it")
    return got[0]


def start(env: Env, work: Path, label: str, asking: bool) -> Session:
    """boxyctl run for LABEL (on a terminal of its own when ASKING), its FIFOs open."""
    name, addr = plan.fqdn("big"), plan.SERVER_BY_NAME["big"].v4
    flags = ["--net", "allowlist", "--allow-host", f"{name}:{PORT}"]
    if asking:
        flags += ["--ask", "--ask-timeout", "10m"]
    _fifos(work, label, env)
    client = [PYTHON, "-I", "client.py", label, name, str(addr), str(PORT)]
    argv = env.argv([str(BIN / "boxyctl"), "run", *flags, "--", *client])
    master = -1
    if asking:
        master, slave = os.openpty()
        proc = subprocess.Popen(argv, cwd=work, stdin=slave, stdout=slave, stderr=slave)
        os.close(slave)
    else:
        proc = subprocess.Popen(argv, cwd=work, stdin=subprocess.DEVNULL)
    # (the FIFOs open once the client opens its ends: the run has started then)
    ctl, out = _open_timed(work / f"ctl.{label}", "w"), _open_timed(work / f"out.{label}", "r")
    s = Session(label, proc, ctl, out, master)
    if asking:
        threading.Thread(target=s.read_terminal, daemon=True).start()
    return s


def stop(s: Session) -> None:
    for f in (s.ctl, s.out):
        with contextlib.suppress(OSError):
            f.close()
    try:
        s.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        s.proc.kill()
        s.proc.wait()
    if s.master >= 0:
        os.close(s.master)


def measure(s: Session, args: argparse.Namespace) -> dict[str, float]:
    lk = s.call("lookups", f"{args.lookups},{PACE}")
    cn = s.call("conns", args.conns)
    if cn["ok"] != args.conns:
        raise BenchError(f"{s.label}: {cn['ok']} of {args.conns} connections answered")
    return {"lookup_ms": lk["median_ms"], "conns_per_s": cn["per_s"]}


def open_questions(asking: list[Session], tag: str) -> None:
    """One question open in each asking session: a name looked up, paused, asked."""
    for i, s in enumerate(asking):
        host = f"q{tag}-{i}.{plan.ZONE[:-1]}"
        s.call("ask", host)
        s.wait_for(f"looks up {host}")
    for s in asking:
        if len(s.call("held")["waiting"]) != 1:
            raise BenchError(f"{s.label}: its question is not open")


def deny_all(asking: list[Session]) -> None:
    for s in asking:
        s.type(b"d")
        if s.call("join", WAIT)["waiting"]:
            raise BenchError(f"{s.label}: a lookup still waits after its answer")


def at_once(s: Session, tag: str) -> int:
    """How many of MAX_OPEN names looked up at once in S are asked at the same time."""
    hosts = [f"c{tag}-{i}.{plan.ZONE[:-1]}" for i in range(MAX_OPEN)]
    s.call("ask", ",".join(hosts))
    time.sleep(1.0)  # every lookup has reached the proxy, and any refusal come back
    held = len(s.call("held")["waiting"])
    for _ in range(held):
        s.type(b"d")
        time.sleep(0.2)
    s.call("join", WAIT)
    return held


Got = dict[tuple[str, str], list[dict[str, float]]]  # (who, phase) -> figures per round


def _phase(
    asking: list[Session],
    other: Session,
    phase: str,
    tag: str,
    args: argparse.Namespace,
    got: Got,
) -> None:
    """One phase measured in the first asking session and the other; with PHASE
    "open", a question open in every asking session throughout, then denied."""
    if phase == "open":
        open_questions(asking, tag)
    for who, s in (("same session", asking[0]), ("other session", other)):
        got.setdefault((who, phase), []).append(measure(s, args))
    if phase == "open":
        for s in asking:  # still paused while measured: the case held
            if len(s.call("held")["waiting"]) != 1:
                raise BenchError(f"{s.label}: its question closed early")
        deny_all(asking)


def rounds(env: Env, work: Path, args: argparse.Namespace) -> tuple[Got, int]:
    """{(who, phase): [figures per round]} and the at-once count."""
    asking = [start(env, work, f"a{i}", True) for i in range(MAX_OPEN)]
    other = start(env, work, "b", False)
    got: Got = {}
    try:
        for s in (asking[0], other):
            measure(s, args)  # warm: the first phase measured is no slower for being first
        for r in range(args.rounds):
            # quiet first in even rounds, open first in odd ones: drift hits both alike
            for phase in ("quiet", "open") if r % 2 == 0 else ("open", "quiet"):
                _phase(asking, other, phase, str(r), args, got)
            print(f"round {r + 1}: {got}", file=sys.stderr, flush=True)
        held = at_once(asking[0], "x")
    finally:
        for s in (*asking, other):
            stop(s)
    return got, held


def _paired(got: Got, who: str, key: str) -> tuple[float, float]:
    """The median open figure, and the median of each round's open ÷ quiet (the two
    phases of a round are measured back to back: what drifts hits both)."""
    quiet, open_ = got[(who, "quiet")], got[(who, "open")]
    ratios = [o[key] / q[key] for q, o in zip(quiet, open_, strict=True)]
    return statistics.median(o[key] for o in open_), statistics.median(ratios)


def figures(got: Got, held: int) -> list[Figure]:
    out = []
    for who in ("same session", "other session"):
        ms, ratio = _paired(got, who, "lookup_ms")
        r, target, met = at_most(ratio, 1.1)
        out.append(Figure("ask", f"lookup, {MAX_OPEN} open ({who})", ms, "ms", r, target, met))
        per_s, ratio = _paired(got, who, "conns_per_s")
        r, target, met = at_least(ratio, 0.9)
        name = f"connections/s, {MAX_OPEN} open ({who})"
        out.append(Figure("ask", name, per_s, "/s", r, target, met))
    name = f"of {MAX_OPEN} names at once, asked at once"
    out.append(Figure("ask", name, held, "", None, INFORMATION, True))
    return out


def run(args: argparse.Namespace) -> int:
    with internet(args.user, args.keep, PREFIX, STATE, CLIENT) as (env, work):
        got, held = rounds(env, work, args)
    emit(figures(got, held), args.json)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8, help="quiet and open phases, alternating")
    ap.add_argument("--lookups", type=int, default=60, help="timed lookups per phase")
    ap.add_argument("--conns", type=int, default=150, help="short connections per phase")
    return main_as_root(ap, run, "bench/ask.py")


if __name__ == "__main__":
    sys.exit(main())
