#!/usr/bin/env python3
"""What the Claude Code hook adds to an intercepted command: `boxyctl hook claude`
(Claude Code's JSON on stdin) and then the rewritten command as the Bash tool runs
it (bash -c), against the same run without the hook (`boxyctl run --net none -- sh -c
true`) and `python3 -c pass`, interleaved in the same rounds. The command is `true`
(hook.yaml intercepts it): what is measured is the hook's path, not a program's own
start. The figure: hook and run against `python3 -c pass` (issue #18: at most 6×).
No network.

Run as the user who will use boxy (not root): `.venv/bin/python bench/hook.py [-n 15]
[--json]`. With --json the figure is a JSON list on stdout (bench/table.py) and the
prose goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.table import Figure, at_most, emit  # noqa: E402
from boxyctl.hook import SETTLED  # noqa: E402

BIN = Path(sys.executable).parent
COMMAND = "true"
HOOK_YAML = 'flags: [--net, none]\nintercept_also: ["true"]\n'
TARGET = 6.0  # hook + run, at most this many times `python3 -c pass`


def timed(argv: list[str], **kw: object) -> tuple[float, subprocess.CompletedProcess[bytes]]:
    t = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, check=False, **kw)  # type: ignore[call-overload]
    took = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{argv[:4]}…: exit {r.returncode}: {r.stderr.decode()[-300:]}")
    return took, r


def hooked(workdir: Path, env: dict[str, str]) -> tuple[float, float]:
    """One intercepted command: (the hook alone, the hook and the rewritten run)."""
    event = {
        "session_id": "bench",
        "transcript_path": "/dev/null",
        "cwd": str(workdir),
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": COMMAND, "description": "bench"},
    }
    t_hook, r = timed(
        [str(BIN / "boxyctl"), "hook", "claude"], input=json.dumps(event).encode(), env=env
    )
    out = json.loads(r.stdout)["hookSpecificOutput"]
    assert out["permissionDecision"] == "allow", out
    t_run, _ = timed(["bash", "-c", out["updatedInput"]["command"]], cwd=workdir)
    return t_hook, t_hook + t_run


def rounds(n: int, workdir: Path, env: dict[str, str]) -> dict[str, float]:
    """Medians in ms of N interleaved rounds: the reference, the bare run, the hook
    alone and the hook with the rewritten run."""
    python3 = [shutil.which("python3") or "/usr/bin/python3", "-c", "pass"]
    # what the hook rewrites the line to, run directly
    bare_argv = [str(BIN / "boxyctl"), "run", "--net", "none", "--", "sh", "-c", COMMAND]
    timed(bare_argv, cwd=workdir)  # warm: boxyd started, the template forked
    hooked(workdir, env)
    times: dict[str, list[float]] = {"python3": [], "bare": [], "hook": [], "total": []}
    for _ in range(n):
        times["python3"].append(timed(python3)[0])
        times["bare"].append(timed(bare_argv, cwd=workdir)[0])
        h, t = hooked(workdir, env)
        times["hook"].append(h)
        times["total"].append(t)
    return {k: statistics.median(v) * 1000 for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=15, help="rounds (default 15)")
    ap.add_argument("--json", action="store_true", help="the figure as JSON on stdout")
    args = ap.parse_args()
    if os.getuid() == 0:
        raise SystemExit("run as the user who will use boxy, not root")
    with tempfile.TemporaryDirectory(prefix="boxy-bench-hook-", dir=Path.home()) as d:
        workdir, config = Path(d) / "work", Path(d) / "config"
        workdir.mkdir()
        (config / "boxy").mkdir(parents=True)
        (config / "boxy" / "hook.yaml").write_text(HOOK_YAML)
        # A user's hook.yaml is older than SETTLED: the hook then reads it parsed
        # (boxyctl/hook.py); one written this moment is parsed anew each time
        time.sleep(SETTLED + 0.2)
        env = {**os.environ, "XDG_CONFIG_HOME": str(config)}  # the hook's own config
        med = rounds(args.n, workdir, env)
    out = sys.stderr if args.json else sys.stdout
    print(f"{args.n} rounds of `{COMMAND}` (--net none), medians:", file=out)
    print(f"  python3 -c pass:                {med['python3']:7.1f} ms", file=out)
    print(f"  bare boxyctl run:               {med['bare']:7.1f} ms", file=out)
    print(f"  boxyctl hook claude alone:      {med['hook']:7.1f} ms", file=out)
    print(f"  hook + rewritten command:       {med['total']:7.1f} ms", file=out)
    print(f"  added per intercepted command:  {med['total'] - med['bare']:7.1f} ms", file=out)
    print(f"  ratio (hooked / bare):          {med['total'] / med['bare']:7.2f}", file=out)
    ratio, target, met = at_most(med["total"] / med["python3"], TARGET)
    emit([Figure("hook", "hook + run", med["total"], "ms", ratio, target, met)], args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
