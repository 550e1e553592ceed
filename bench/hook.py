#!/usr/bin/env python3
"""What the Claude Code hook adds to an intercepted command: `boxyctl hook claude`
(Claude Code's JSON on stdin) and then the rewritten command as the Bash tool runs
it (bash -c), against the bare `boxyctl run -p node --net none -- npm --version`,
interleaved in the same run. Prints the medians and the ratio. No network.

Run as the user who will use boxy (not root): `.venv/bin/python bench/hook.py [-n 15]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
COMMAND = "npm --version"


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=15, help="rounds (default 15)")
    args = ap.parse_args()
    if os.getuid() == 0:
        raise SystemExit("run as the user who will use boxy, not root")
    with tempfile.TemporaryDirectory(prefix="boxy-bench-hook-", dir=Path.home()) as d:
        workdir, config = Path(d) / "work", Path(d) / "config"
        workdir.mkdir()
        (config / "boxy").mkdir(parents=True)
        (config / "boxy" / "hook.yaml").write_text("flags: [--net, none]\n")
        env = {**os.environ, "XDG_CONFIG_HOME": str(config)}  # the hook's own config
        bare_argv = [str(BIN / "boxyctl"), "run", "-p", "node", "--net", "none", "--"]
        bare_argv += COMMAND.split()
        timed(bare_argv, cwd=workdir)  # warm: boxyd started, the template forked
        hooked(workdir, env)
        bare, hook_only, total = [], [], []
        for _ in range(args.n):
            bare.append(timed(bare_argv, cwd=workdir)[0])
            h, t = hooked(workdir, env)
            hook_only.append(h)
            total.append(t)
    med = {k: statistics.median(v) * 1000 for k, v in
           (("bare", bare), ("hook", hook_only), ("total", total))}  # fmt: skip
    print(f"{args.n} rounds of `{COMMAND}` (profile node, --net none), medians:")
    print(f"  bare boxyctl run:               {med['bare']:7.1f} ms")
    print(f"  boxyctl hook claude alone:      {med['hook']:7.1f} ms")
    print(f"  hook + rewritten command:       {med['total']:7.1f} ms")
    print(f"  added per intercepted command:  {med['total'] - med['bare']:7.1f} ms")
    print(f"  ratio (hooked / bare):          {med['total'] / med['bare']:7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
