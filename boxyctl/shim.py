"""boxy-sh: a shell for harnesses that let the user name theirs. `boxy-sh -c CMD`
runs CMD inside `boxyctl run`, with the profile the hook would choose, when the hook
would intercept it (hook.yaml, boxyctl/hookpolicy.py); any other command goes to
/bin/sh unchanged. boxyd out of reach: the run fails, nothing runs unsandboxed."""

from __future__ import annotations

import os
import sys

from boxy.errors import BoxyError

SH = "/bin/sh"


def split_args(args: list[str]) -> tuple[list[str], str | None, list[str]]:
    """sh's ARGS as (its options, the -c command string or None, the operands
    after it). Options with c in them (-c, -lc, -ec) take the first operand."""
    opts: list[str] = []
    i = 0
    while i < len(args) and args[i][:1] in ("-", "+") and len(args[i]) > 1:
        opts.append(args[i])
        i += 1
        if opts[-1] == "--":
            break
        if opts[-1] in ("-o", "+o") and i < len(args):  # -o pipefail
            opts.append(args[i])
            i += 1
    operands = args[i:]
    has_c = any("c" in o for o in opts if o[:2] not in ("--", "-o", "+o") and o[:1] in "-+")
    if has_c and operands:
        return opts, operands[0], operands[1:]
    return opts, None, operands


def run_argv(args: list[str]) -> list[str] | None:
    """`boxyctl run …` arguments for sh ARGS, or None: hand them to /bin/sh."""
    from boxyctl import hook
    from boxyctl import hookpolicy as hp

    config, _ = hook.load_config()
    opts, command, rest = split_args(args)
    cwd = os.getcwd()
    if command is None:  # a script or an interactive shell: wrapped only under "*"
        if "*" not in config.intercept:
            return None
        decision: hp.Decision | None = hp.Decision(("*",), None)
    else:
        decision = hp.decide(command, config, approved=hook.approved_profile(cwd))
    if decision is None:
        return None
    argv = ["run"]
    if decision.profile is not None:
        argv += ["-p", decision.profile]
    inner = [*opts, command, *rest] if command is not None else args
    return [*argv, *config.flags, "--", config.shell, *inner]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        run = run_argv(args)
    except (BoxyError, OSError) as e:
        sys.stderr.write(f"boxy-sh: {e}\n")
        return 2
    if run is None:
        os.execv(SH, [SH, *args])
    from boxyctl.main import main as boxyctl

    return boxyctl(run)
