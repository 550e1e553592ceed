"""`boxyctl run --net none` end to end: what must keep working (a sandbox that blocks
the job is useless) and how bad input is refused before anything starts."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy, User

pytestmark = pytest.mark.sandbox

NET = ("--net", "none")


def out(r: subprocess.CompletedProcess[bytes]) -> str:
    return r.stdout.decode(errors="replace")


def err(r: subprocess.CompletedProcess[bytes]) -> str:
    return r.stderr.decode(errors="replace")


# --- ordinary work ------------------------------------------------------------------


def test_shell_pipeline(boxy: Boxy) -> None:
    r = boxy.sh("seq 1 1000 | sort -rn | head -3", input=b"")
    assert r.returncode == 0, err(r)
    assert out(r) == "1000\n999\n998\n"


def test_python(boxy: Boxy) -> None:
    r = boxy.run(
        *NET,
        cmd=["python3", "-c", "import sys, json; print(json.dumps([sys.version_info[0], 6 * 7]))"],
        input=b"",
    )
    assert r.returncode == 0, err(r)
    assert out(r) == "[3, 42]\n"


def test_node(boxy: Boxy) -> None:
    # libuv probes io_uring (refused with ENOSYS) and uses its thread pool for fs.
    script = (
        "const fs = require('fs');"
        "fs.promises.writeFile('node-out.txt', 'from node')"
        ".then(() => fs.promises.readFile('node-out.txt', 'utf8'))"
        ".then(t => console.log(t, 6 * 7));"
    )
    r = boxy.run(*NET, cmd=["node", "-e", script], input=b"")
    assert r.returncode == 0, err(r)
    assert out(r) == "from node 42\n"
    assert (boxy.workdir / "node-out.txt").read_text() == "from node"


def test_cc_compile_and_run(boxy: Boxy) -> None:
    src = boxy.workdir / "hello.c"
    src.write_text(
        '#include <stdio.h>\nint main(void) { printf("hello from c %d\\n", 6 * 7); return 0; }\n'
    )
    boxy.user.chown(src)
    r = boxy.sh("cc -O2 -o hello hello.c && ./hello", input=b"")
    assert r.returncode == 0, err(r)
    assert out(r) == "hello from c 42\n"
    assert (boxy.workdir / "hello").is_file()  # the binary landed in the work directory


def test_stdin_from_pipe(boxy: Boxy) -> None:
    data = b"line one\nline two\n" * 1000
    r = boxy.run(
        *NET,
        cmd=[
            "python3",
            "-c",
            "import sys, hashlib; d = sys.stdin.buffer.read();"
            "print(len(d), hashlib.sha256(d).hexdigest())",
        ],
        input=data,
    )
    assert r.returncode == 0, err(r)
    assert out(r) == f"{len(data)} {hashlib.sha256(data).hexdigest()}\n"


LOOPBACK = r"""
import socket, sys, threading
for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.bind((host, 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    def serve():
        conn, _ = srv.accept()
        with conn:
            conn.sendall(b"echo:" + conn.recv(100))
    t = threading.Thread(target=serve)
    t.start()
    with socket.create_connection((host, port), timeout=5) as c:
        c.sendall(host.encode())
        print(c.recv(100).decode())
    t.join()
    srv.close()
"""


def test_loopback_tcp_under_net_none(boxy: Boxy) -> None:
    r = boxy.run(*NET, cmd=["python3", "-c", LOOPBACK], input=b"", timeout=60)
    assert r.returncode == 0, err(r)
    assert out(r) == "echo:127.0.0.1\necho:::1\n"


# --- exit statuses ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "status"),
    [
        ("exit 0", 0),
        ("exit 3", 3),
        ("exit 255", 255),
        ("kill -KILL $$", 137),
        ("kill -TERM $$", 143),
    ],
)
def test_exit_status_propagated(boxy: Boxy, script: str, status: int) -> None:
    r = boxy.sh(f"echo started; {script}; echo not-reached", input=b"")
    assert out(r) == "started\n"
    assert r.returncode == status, err(r)


def test_missing_command_inside(boxy: Boxy) -> None:
    r = boxy.run(*NET, cmd=["does-not-exist"], input=b"")
    assert r.returncode == 127, err(r)
    assert "does-not-exist" in err(r) and "not found" in err(r), err(r)
    assert "Traceback" not in err(r)


# --- bad input: refused before anything starts ------------------------------------------


def _snapshot(d: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(d)): (p.stat().st_mtime_ns, p.stat().st_size) for p in d.rglob("*")}


BAD_INPUT = {
    "unknown-flag": (["--bogus-flag"], "--bogus-flag: unknown flag"),
    "bad-size": (["--memory", "2XB"], "is not a size"),
    "missing-ro": (["--ro", "/does/not/exist"], "no such file or directory"),
    "pcap-net-none": (["--pcap", "x"], "--pcap"),
    "no-command": ([], "missing command"),
    # the review's first hour (issue 8 §2)
    "pids-1": (["--pids", "1"], "below the minimum of 8"),
    "pids-2": (["--pids", "2"], "below the minimum of 8"),
    "memory-1": (["--memory", "1"], "below the minimum of 1MiB (a plain number is bytes"),
    "memory-1k": (["--memory", "1k"], "below the minimum of 1MiB"),
    "memory-2.5": (["--memory", "2.5"], "below the minimum of 1MiB"),
    "timeout-negative": (["--timeout", "-5s"], "--timeout: -5s is negative"),
    "copy-to-root": (["--copy", "existing:/"], "the destination must name a file"),
    "copy-to-usr": (
        ["--copy", "existing:/usr/bin/x"],
        "read-only /usr; copy it under $HOME or /tmp",
    ),
    "copy-unreadable": (["--copy-ro", "locked"], "locked: not readable by you"),
    "audit-log-dir": (["--audit-log", "."], "Is a directory"),
    "audit-log-unwritable": (["--audit-log", "ro/audit.jsonl"], "Permission denied"),
    "tcp-without-ports": (["--allow-host", "example.com/tcp"], "/tcp needs explicit ports"),
    "offline-allow-host": (["-p", "offline", "--allow-host", "x.example"], "has no network"),
    "newline-in-path": (["--ro", "/a\nb"], "--ro /a\\nb: no such file"),
    "empty-command": (["EMPTY"], "the command is an empty string"),
    # the first hour, second round (issue 17): refused before the start, not late
    "rw-root": (["--rw", "/root"], "--rw /root: not readable by you"),
    "rw-read-only-tree": (["--rw", "/usr/share"], "--rw /usr/share: not writable by you; --ro"),
    "mkdir-root": (["--mkdir", "/root/x"], "--mkdir /root/x: cannot be looked at"),
    "mkdir-etc": (["--mkdir", "/etc/x"], "--mkdir /etc/x: cannot be made: /etc is not writable"),
    # the first hour, third round (issue 33 §2): a workdir that is no project
    "workdir-etc": (["-w", "/etc"], "--workdir /etc: not writable by you, and the work directory"),
    "secret-and-env": (["--secret", "LANG", "-e", "LANG=x"], "-e LANG: LANG is also passed as a"),
    "net-twice": (["--net", "public"], "--net given twice (none, then public); give it once"),
    "memory-above-the-machine": (["--memory", "100TiB"], "more than this machine's"),
    "profile-unknown": (["-p", "nosuch"], "--profile nosuch: no such profile"),
    "allow-host-url": (["--allow-host", "https://example.com/"], "give its host alone"),
    "cidr-net-none": (["--allow-cidr", "10.7.0.0/16"], "cannot be combined with --net none"),
    "mistyped-flag": (["--nett", "none"], "--nett: unknown flag (did you mean --net?)"),
    # the first hour, third round (issue 33 §2)
    "workdir-root": (["-w", "/root"], "--workdir /root: permission denied (you cannot list"),
    "workdir-root-sub": (["-w", "/root/sub"], "--workdir /root/sub: permission denied (/root is"),
    "path-too-long": (["--ro", "/" + "a/" * 2500], ": too long (5000 bytes; Linux takes"),
    "run-json": (["--json"], "run takes no --json: --report FILE writes"),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_refused(boxy: Boxy, workdir: Path, case: str) -> None:
    flags, words = BAD_INPUT[case]
    (workdir / "locked").write_text("secret")
    (workdir / "ro").mkdir()
    (workdir / "existing").write_text("keep")
    boxy.user.chown(workdir)
    (workdir / "locked").chmod(0)
    (workdir / "ro").chmod(0o555)
    before = _snapshot(workdir)
    # If anything did start, it would leave `started` in the work directory.
    cmd = None if not flags else ["sh", "-c", "touch started"]
    if flags == ["EMPTY"]:
        flags, cmd = [], [""]
    net = () if "-p" in flags or "--allow-host" in flags else NET
    r = boxy.run(*net, *flags, cmd=cmd, input=b"")
    lines = err(r).splitlines()
    assert r.returncode == 2, (r.returncode, err(r))
    assert len(lines) == 1, lines
    assert words in lines[0], lines
    assert "Traceback" not in err(r)
    assert lines[0].startswith("boxyctl: "), lines
    assert out(r) == ""
    assert _snapshot(workdir) == before
    assert not (workdir / "started").exists()


# --- environment and fds -----------------------------------------------------------------


def test_env_flags(boxy: Boxy) -> None:
    r = boxy.run(
        *NET,
        "-e",
        "FOO=bar",
        "-e",
        "HOME_ONLY",
        "-e",
        "EMPTY=",
        cmd=[
            "python3",
            "-c",
            "import os; print(repr(os.environ.get('FOO')),"
            "repr(os.environ.get('HOME_ONLY')), repr(os.environ.get('EMPTY')))",
        ],
        input=b"",
        extra_env={"HOME_ONLY": "from-client"},
    )
    assert r.returncode == 0, err(r)
    assert out(r) == "'bar' 'from-client' ''\n"


ALLOWED_ENV = {
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "PATH",
    "TERM",
    "LANG",
    "LANGUAGE",
    "TZ",
    "COLORTERM",
    "NO_COLOR",
}


def test_env_is_scrubbed(boxy: Boxy, user: User) -> None:
    secrets = {
        "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock",
        "GITHUB_TOKEN": "ghp_secret",
        "NPM_TOKEN": "npm_secret",
        "MY_API_TOKEN": "tok",
        "AWS_SECRET_ACCESS_KEY": "aws",
        "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/1001/bus",
        "RANDOM_HOST_VAR": "x",
    }
    r = boxy.run(
        *NET,
        cmd=["python3", "-c", "import os\nfor k in sorted(os.environ): print(k)"],
        input=b"",
        extra_env=secrets,
    )
    assert r.returncode == 0, err(r)
    names = set(out(r).split())
    assert {"HOME", "PATH", "USER"} <= names, names
    for bad in ("SSH_AUTH_SOCK", "XDG_RUNTIME_DIR", *secrets):
        assert bad not in names, f"{bad} leaked into the sandbox"
    assert not [n for n in names if "TOKEN" in n], names
    extra = {n for n in names if n not in ALLOWED_ENV and not n.startswith("LC_")}
    assert not extra, f"names outside the allowlist: {extra}"


def test_only_stdio_fds_open(boxy: Boxy) -> None:
    r = boxy.run(
        *NET,
        cmd=["python3", "-c", "import os; print(sorted(os.listdir('/proc/self/fd'), key=int))"],
        input=b"",
    )
    assert r.returncode == 0, err(r)
    # 0-2, plus the fd listdir itself holds open while reading the directory
    assert out(r) == "['0', '1', '2', '3']\n"


def test_workdir_flag(boxy: Boxy, user: User, workdir: Path) -> None:
    other = workdir.parent / f"{workdir.name}-other"
    other.mkdir()
    user.chown(other)
    try:
        r = boxy.run(
            *NET, "--workdir", str(other), cmd=["sh", "-c", "pwd; echo hi > made-here"], input=b""
        )
        assert r.returncode == 0, err(r)
        assert out(r) == f"{other}\n"
        assert (other / "made-here").read_text() == "hi\n"
        assert not (workdir / "made-here").exists()
    finally:
        for p in other.iterdir():
            p.unlink()
        other.rmdir()


def test_workdir_relative(boxy: Boxy, user: User, workdir: Path) -> None:
    sub = workdir / "sub"
    sub.mkdir()
    user.chown(sub)
    r = boxy.run(*NET, "-w", "sub", cmd=["pwd"], input=b"")
    assert r.returncode == 0, err(r)
    assert out(r) == f"{sub}\n"
    assert os.path.samefile(out(r).strip(), sub)


# --- nothing in the plan's size that a payload can reach -----------------------------------


def test_thousands_of_nested_repositories_do_not_lock_the_directory(boxy: Boxy) -> None:
    """3,000 `d$i/.git` made the plan (one bind each) too long for one datagram: every
    later run in that directory failed."""
    make = "import os\nfor i in range(3000): os.makedirs(f'd{i}/.git')\nprint('made')"
    r = boxy.run(*NET, cmd=["python3", "-c", make])  # (a process per mkdir took 6 s)
    assert r.returncode == 0 and out(r) == "made\n", err(r)
    r = boxy.sh("ls -d d*/.git | wc -l")
    assert r.returncode == 0 and out(r).strip() == "3000", err(r)


def test_an_arg_max_sized_argv_runs(boxy: Boxy) -> None:
    """What bwrap and a plain shell run: 15 arguments of 100 KB (1.5 MB of argv)."""
    args = [f"{i:02d}" + "x" * 100_000 for i in range(15)]
    r = boxy.run(
        *NET,
        cmd=[
            "python3",
            "-c",
            "import sys; print(len(sys.argv) - 1, sum(map(len, sys.argv[1:])))",
            *args,
        ],
        input=b"",
    )
    assert r.returncode == 0, err(r)
    assert out(r) == f"15 {sum(map(len, args))}\n"


@pytest.fixture
def huge_tree(user: User, workdir: Path) -> Iterator[Path]:
    """300,000 directories. On a tmpfs of its own when we are root (CI): this disk
    takes about 18 s to make them and 30 s to remove them, a tmpfs 2 s and nothing."""
    big = workdir / "big"
    big.mkdir()
    mounted = (
        os.getuid() == 0
        and subprocess.run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size=1g,mode=0755,uid={user.uid},gid={user.gid}",
                "tmpfs",
                str(big),
            ],
            capture_output=True,
        ).returncode
        == 0
    )
    user.chown(big)
    script = (
        "import os, sys\nfor i in range(300):\n    for j in range(1000):\n"
        "        os.makedirs(f'{sys.argv[1]}/d{i}/e{j}')\n"
    )
    made = user.run(["python3", "-c", script, str(big / "tree")], timeout=300)
    try:
        assert made.returncode == 0, err(made)
        yield big / "tree"
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(big)], check=True)


def test_a_huge_tree_does_not_stall_another_session(
    boxy: Boxy, user: User, huge_tree: Path
) -> None:
    """The walks of a 300,000-directory work tree run in a worker thread: another
    session keeps starting while one is being prepared (they used to run on the event
    loop: another session's `echo` took 8.3 s instead of 0.4 s)."""
    small = Boxy(user, boxy.workdir / "small")
    small.workdir.mkdir()
    user.chown(small.workdir)

    def start_up() -> None:
        r = small.sh("true")
        assert r.returncode == 0, err(r)

    def walking() -> bool:
        r = user.run([str(BIN / "boxyctl"), "ps", "--json"])
        return any(s["state"] == "starting" for s in json.loads(r.stdout)["sessions"])

    start_up()  # warm
    argv = user.cmd(
        [str(BIN / "boxyctl"), "run", "--net", "none", "-w", str(huge_tree), "--", "true"]
    )
    proc = subprocess.Popen(
        argv, cwd=boxy.workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60  # into its walk (about 4 s for this tree)
        while not walking():
            assert proc.poll() is None and time.monotonic() < deadline, "never seen starting"
            time.sleep(0.02)
        for _ in range(5):
            start_up()
        still_walking = walking()
    finally:
        proc.wait(timeout=120)
    # five starts went through while the big run still walked: not held until it ended
    # (as on the event loop they were); how much slower they are is bench/walk.py's
    assert still_walking, "the big run's start ended before the samples: they were held"
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""


def test_mkdir_of_a_missing_directory_works_and_is_guarded(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    """--mkdir's whole purpose (the claude preset's first run in every new project): the
    directory is created, and what the payload plants in it is still checked."""
    new = workdir.parent / f"{workdir.name}-made"
    try:
        r = boxy.sh(
            f"cd {new} && git init -q && printf '#!/bin/sh\\n' > .git/hooks/pre-commit && "
            "chmod +x .git/hooks/pre-commit && echo made",
            "--mkdir",
            str(new),
        )
        assert r.returncode == 0 and out(r) == "made\n", err(r)
        assert new.is_dir()
        # made before the live guard started, so it was watched from the start
        assert "not watched" not in err(r), err(r)
        assert "git guard: moved .git/hooks/pre-commit" in err(r), err(r)
        assert not (new / ".git/hooks/pre-commit").exists()
    finally:
        subprocess.run(["rm", "-rf", str(new)], check=False)


@pytest.mark.parametrize("where", ["home", "root"])
def test_running_from_home_says_why(boxy: Boxy, user: User, where: str) -> None:
    cwd = user.home if where == "home" else Path("/")
    r = user.run([str(BIN / "boxyctl"), "run", "--net", "none", "--", "true"], cwd=cwd)
    lines = err(r).splitlines()
    assert r.returncode == 2 and len(lines) == 1, err(r)
    verb = "is" if where == "home" else "holds"
    assert (
        f"{verb} your home directory {user.home}, whose keys and credentials are never exposed; "
        "run in a project directory, or pass -w ~/project" in lines[0]
    )


def test_a_script_without_shebang_runs_through_sh(boxy: Boxy, workdir: Path) -> None:
    """As execvp(3) (and bwrap) do: the kernel's ENOEXEC means /bin/sh reads it."""
    script = workdir / "plain-script"
    script.write_text('echo "ran with $# args: $1"\n')
    script.chmod(0o755)
    boxy.user.chown(workdir)
    r = boxy.run(*NET, cmd=["./plain-script", "one"], input=b"")
    assert r.returncode == 0 and out(r) == "ran with 1 args: one\n", err(r)
    r = boxy.run(*NET, "-e", f"PATH={workdir}:/usr/bin:/bin", cmd=["plain-script"], input=b"")
    assert r.returncode == 0 and out(r) == "ran with 0 args: \n", err(r)


def test_verbose_sizes_as_people_write_them(boxy: Boxy) -> None:
    r = boxy.sh("true", "-v", "--memory", "2GiB")
    assert "--memory 2.0GiB: sizes the scratch tmpfs" in err(r), err(r)


def test_one_daemon_with_or_without_xdg_runtime_dir(boxy: Boxy, user: User) -> None:
    """Without XDG_RUNTIME_DIR the client looks in /run/user/UID, as systemd makes it:
    one user never gets two daemons."""
    with_var = user.run(
        [str(BIN / "boxyctl"), "run", "--net", "none", "--", "true"], cwd=boxy.workdir
    )
    assert with_var.returncode == 0, err(with_var)
    env = {k: v for k, v in user.env().items() if k != "XDG_RUNTIME_DIR"}
    argv = [
        "env",
        "-i",
        *(f"{k}={v}" for k, v in env.items()),
        str(BIN / "boxyctl"),
        "daemon",
        "status",
    ]
    import os as _os

    cmd = argv if _os.getuid() == user.uid else ["runuser", "-u", user.name, "--", *argv]
    without = subprocess.run(cmd, capture_output=True, timeout=30)
    status = user.run([str(BIN / "boxyctl"), "daemon", "status"])
    pid = status.stdout.split(b"pid ")[1].split()[0] if b"pid " in status.stdout else b"?"
    assert b"running" in without.stdout and f"pid {pid.decode()} ".encode() in without.stdout, (
        without,
        status,
    )


def test_a_clean_run_leaves_no_quarantine_directory(boxy: Boxy, user: User, workdir: Path) -> None:
    subprocess.run(["git", "init", "-q", str(workdir)], check=True)
    user.chown(workdir)
    q = user.home / ".local/state/boxy/quarantine"
    before = set(os.listdir(q)) if q.exists() else set()
    r = boxy.sh("true")
    assert r.returncode == 0, err(r)
    after = set(os.listdir(q)) if q.exists() else set()
    assert after == before, f"a run with nothing to quarantine made {after - before}"
