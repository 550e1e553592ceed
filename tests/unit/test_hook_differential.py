"""The hook against the shell itself (issue 31 §6): bash runs each line with recording
stubs for every intercepted program first on PATH, and a line from which bash ran one
must be one the hook wraps. The lines are the shapes an attack on the hook found (197
lines in 67 shapes got through a first version), and more, generated for several
names; every test can fail: a shape the rule misses is a line bash runs and the hook
does not wrap."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from boxyctl import hookpolicy as hp

BASH = "/bin/bash"
NAMES = ["npm", "pip", "make", "cargo", "node", "pytest"]
SHAPES = [
    "{n} i",
    "setsid {n} i",
    "flock {tmp}/lock {n} i",
    "nohup {n} i >/dev/null 2>&1",
    "time {n} i",
    "command {n} i",
    "builtin command {n} i",
    "env {n} i",
    "env -i PATH=$PATH {n} i",
    "env -S '{n} i'",
    "timeout 5 {n} i",
    "nice -n 1 {n} i",
    "stdbuf -o0 {n} i",
    "xargs {n} < /dev/null",
    "xargs -I{{}} {n} {{}} <<< x",
    "find . -maxdepth 0 -exec {n} i \\;",
    "find . -maxdepth 0 -exec sh -c '{n} i' \\;",
    "script -qc '{n} i' /dev/null",
    "echo '{n} i' | sh",
    "printf '%s\\n' '{n} i' | bash",
    "sh <<< '{n} i'",
    "bash -s <<< '{n} i'",
    "sh <<'EOF'\n{n} i\nEOF",
    "source <(echo '{n} i')",
    ". <(echo '{n} i')",
    "bash <(echo '{n} i')",
    "cat <({n} i)",
    "echo x > >({n} i)",
    "{{{n},}} i",
    "{{x,{n}}} i",
    "{stubs}/{glob} i",
    "function f {{ {n} i; }}; f",
    "f() {{ {n} i; }}; f",
    "( {n} i )",
    "{{ {n} i; }}",
    "{n} i &\nwait",
    "if true; then {n} i; fi",
    "for x in 1; do {n} i; done",
    "case x in x) {n} i;; esac",
    "while true; do {n} i; break; done",
    "bash -o errexit -c '{n} i'",
    "bash -e -c '{n} i'",
    "sh -c 'sh -c \"{n} i\"'",
    "trap '{n} i' EXIT",
    "A[0]=x {n} i",
    "X=1 Y=2 {n} i",
    "eval {n} i",
    "eval '{n}' i",
    'eval "n""o" 2>/dev/null; {n} i',
    "P={n}; $P i",
    "$(echo {n}) i",
    "`echo {n}` i",
    '"$(echo {n})" i',
    "{split} i",
    "'{n}' i",
    "\\{n} i",
    "awk 'BEGIN{{system(\"{n} i\")}}'",
    "sed -n '1e {n} i' <<< x",
    "perl -e 'system(\"{n} i\")'",
    "git -c alias.zz='!{n} i' zz",
    "true && {n} i",
    "false || {n} i",
    "true; {n} i",
    "! {n} i",
    "exec {n} i",
    "coproc {n} i\nwait",
    # a second attack round (issue 31): braces that split the name, data run as
    # commands, a program copied under another name, variables that pick the program,
    # a name computed by an interpreter
    "{{{head},--x}}{tail} i",
    "{head}{{{tail},}} i",
    "{head}{{{tail}..{tail}}} i",
    "echo '{n} i' | xargs -0 sh -c",
    "echo {n} | xargs -I% sh -c '% i'",
    "find {stubs} -name '{glob}' -exec {{}} i \\;",
    "find . -maxdepth 0 -exec sh -s \\; <<< '{n} i'",
    "echo '{n} i' > {tmp}/e; BASH_ENV={tmp}/e bash -c true",
    "ln -sf {stubs}/{n} {tmp}/x && PATH={tmp}:/usr/bin:/bin x i",
    "cp {stubs}/{n} {tmp}/y; PATH={tmp}:/usr/bin:/bin y i",
    "mkdir -p {tmp}/b && mv {tmp}/y {tmp}/b/z 2>/dev/null; cp {stubs}/{n} {tmp}/b/z; PATH={tmp}/b:/usr/bin z i",
    "export PATH={tmp}/b:/usr/bin; cp {stubs}/{n} {tmp}/b/w; w i",
    "echo 'system(\"{n} i\")' > {tmp}/a.pl; perl {tmp}/a.pl",
    "printf 'BEGIN{{system(\"{n} i\")}}' > {tmp}/a.awk; awk -f {tmp}/a.awk",
    'perl -e \'system(scalar(reverse("{rev}")) . " i")\'',
    'awk \'BEGIN{{n="{rev}"; r=""; for(i=length(n);i>0;i--) r=r substr(n,i,1); system(r)}}\'',
    "echo {rev} | rev | sed 's/.*/& i/e'",
    "git -c alias.zz='!sh' zz <<< '{n} i'",
]


def _stubs(root: Path) -> Path:
    """A directory of scripts named like every intercepted program (and the shells'
    helpers the lines need stay the system's): each records its name."""
    stubs = root / "stubs"
    stubs.mkdir()
    log = root / "ran.log"
    for name in {n for n in hp.DEFAULT_INTERCEPT if " " not in n} | set(NAMES):
        path = stubs / name
        path.write_text(f'#!/bin/sh\necho "$(basename "$0")" >> {log}\n')
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return stubs


def _bash(line: str, cwd: Path, env: dict[str, str]) -> None:
    """LINE run by bash, its whole process group ended after 5 s (a line may leave a
    reader waiting)."""
    proc = subprocess.Popen(
        [BASH, "-c", line], cwd=cwd, env=env, start_new_session=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()


def _lines(tmp: Path, stubs: Path) -> list[str]:
    out = []
    for shape in SHAPES:
        for n in NAMES:
            split = f'"{n[:1]}""{n[1:]}"'
            out.append(
                shape.format(
                    n=n,
                    tmp=tmp,
                    stubs=stubs,
                    glob=n[:-1] + "?",
                    split=split,
                    head=n[:-1],
                    tail=n[-1],
                    rev=n[::-1],
                )  # fmt: skip
            )
    return out


def test_every_line_bash_runs_an_intercepted_program_from_is_wrapped(tmp_path: Path) -> None:
    stubs = _stubs(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    config = hp.HookConfig()
    missed, ran_any = [], 0
    for line in _lines(tmp_path, stubs):
        log = tmp_path / "ran.log"
        log.unlink(missing_ok=True)
        _bash(line, work, env)
        ran = log.read_text().split() if log.exists() else []
        ran_any += bool(ran)
        if ran and hp.decide(line, config) is None:
            missed.append((line, ran))
    assert not missed, "\n".join(f"{line!r}: bash ran {ran}" for line, ran in missed)
    # the shapes really run what they name (the stubs are what bash found)
    assert ran_any >= len(SHAPES) * len(NAMES) * 0.9, ran_any


def test_the_plain_programs_run_none_of_their_arguments(tmp_path: Path) -> None:
    """What the rule leaves unwrapped really runs nothing: each PLAIN program with an
    intercepted name among its arguments, run by bash with the stubs first on PATH."""
    stubs = _stubs(tmp_path)
    (tmp_path / "work").mkdir()
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path)}
    for program in sorted(hp.PLAIN - {"exit", "cd"}):
        for args in ("npm", "npm i", "-- npm", "--help npm"):
            line = f"{program} {args}"
            assert hp.decide(line, hp.HookConfig()) is None, line
            _bash(line, tmp_path / "work", env)
            assert not (tmp_path / "ran.log").exists(), line


def test_bash_is_there() -> None:
    assert os.access(BASH, os.X_OK)  # the differential's reference (util-linux's script too)
