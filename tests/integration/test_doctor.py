"""`boxyctl doctor` against this machine: its format, its exit status, and each
verdict checked against an independent look at the same kernel feature."""

from __future__ import annotations

import ctypes
import json
import os
import pty
import re
import select
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from boxy.checks import Check, render
from boxyd.daemon import doctor
from tests.conftest import BIN, User

ROOT = Path(__file__).resolve().parents[2]
NAMES = (
    "kernel",
    "writer-pidfd",
    "landlock",
    "landlock-unix",
    "seccomp",
    "seccomp-names",
    "userns",
    "apparmor",
    "nftables",
    "veth",
    "review",
    "network",
    "dns-upstream",
    "ipv6-route",
    "git",
    "cgroup2",
    "systemd-user",
    "session-bus",
)
HARD = {"landlock", "seccomp", "userns", "apparmor"}
LINE = re.compile(
    r"^ (?P<sign>[+-]) (?P<name>[a-z0-9-]+) +(?P<verdict>ok|missing) +(?P<need>required|optional)"
    r" +(?P<detail>\S.*)$"
)
AS_USER = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []


def _python_for_user() -> str:
    """The venv's interpreter if the unprivileged user may run it, else Debian's."""
    venv = str(ROOT / ".venv" / "bin" / "python")
    ok = subprocess.run([*AS_USER, venv, "-c", ""], capture_output=True, check=False)
    return venv if ok.returncode == 0 else "/usr/bin/python3"


def run_doctor(
    *, prefix: list[str] | None = None, env: dict[str, str] | None = None, as_user: bool = True
) -> subprocess.CompletedProcess[str]:
    cmd = [_python_for_user(), "-m", "boxyd.daemon.doctor"]
    full_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [*(AS_USER if as_user else []), *(prefix or []), *cmd],
        capture_output=True,
        text=True,
        env=full_env,
        cwd="/",
        timeout=30,
        check=False,
    )


def parse(stdout: str) -> dict[str, re.Match[str]]:
    lines = stdout.splitlines()
    matches = [LINE.match(ln) for ln in lines]
    bad = [ln for ln, m in zip(lines, matches, strict=True) if m is None]
    assert not bad, f"lines not in the doctor's format: {bad}"
    return {m["name"]: m for m in matches if m}


def as_user_ok(*argv: str) -> bool:
    return (
        subprocess.run(
            [*AS_USER, *argv], capture_output=True, cwd="/", timeout=30, check=False
        ).returncode
        == 0
    )


@pytest.fixture(scope="module")
def unprivileged() -> subprocess.CompletedProcess[str]:
    return run_doctor()


@pytest.fixture(scope="module")
def lines(unprivileged: subprocess.CompletedProcess[str]) -> dict[str, re.Match[str]]:
    return parse(unprivileged.stdout)


@pytest.fixture(scope="module")
def facts() -> dict[str, object]:
    return doctor.facts()


def test_checks_are_data_in_a_fixed_order() -> None:
    results = doctor.checks()
    assert all(isinstance(c, Check) for c in results)
    assert tuple(c.name for c in results) == NAMES
    assert {c.name for c in results if c.hard} == HARD
    for c in results:
        assert c.detail and "\n" not in c.detail, c


def test_unprivileged_output_is_aligned_lines_and_exit_0(
    unprivileged: subprocess.CompletedProcess[str], lines: dict[str, re.Match[str]]
) -> None:
    assert unprivileged.returncode == 0, unprivileged.stdout + unprivileged.stderr
    assert tuple(lines) == NAMES
    assert "\x1b" not in unprivileged.stdout  # a pipe gets no escapes
    assert len({m.start("verdict") for m in lines.values()}) == 1
    assert len({m.start("detail") for m in lines.values()}) == 1
    for m in lines.values():
        assert (m["sign"] == "+") == (m["verdict"] == "ok"), m.group(0)
    assert lines["userns"]["verdict"] == "ok", lines["userns"].group(0)
    assert lines["userns"]["detail"].startswith("unprivileged user+mount+pid+net namespaces")


def test_a_missing_hard_requirement_exits_1(facts: dict[str, object]) -> None:
    if not facts["userns"]:
        pytest.skip("no unprivileged user namespaces (the doctor's userns line)")
    # In a user namespace of its own with max_user_namespaces=0, userns creation
    # really fails (ENOSPC): the doctor must say so and exit 1.
    res = run_doctor(
        prefix=[
            "unshare",
            "--user",
            "--map-root-user",
            "sh",
            "-c",
            'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"',
            "sh",
        ]
    )
    got = parse(res.stdout)
    assert res.returncode == 1, res.stdout + res.stderr
    assert got["userns"]["verdict"] == "missing"
    assert "ENOSPC" in got["userns"]["detail"]
    assert "max_user_namespaces 0" in got["userns"]["detail"]
    assert "userns" in res.stderr


def test_kernel_line_is_uname(lines: dict[str, re.Match[str]]) -> None:
    assert lines["kernel"]["detail"] == os.uname().release


def test_landlock_lines_agree_with_a_direct_syscall(
    lines: dict[str, re.Match[str]], facts: dict[str, object]
) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ret = libc.syscall(ctypes.c_long(444), None, ctypes.c_long(0), ctypes.c_long(1))
    abi = ret if ret > 0 else None
    assert facts["landlock_abi"] == abi
    assert (lines["landlock"]["verdict"] == "ok") == (abi is not None)
    if abi is not None:
        assert re.match(rf"ABI {abi}\b", lines["landlock"]["detail"])
    assert (lines["landlock-unix"]["verdict"] == "ok") == (abi is not None and abi >= 9)


def test_seccomp_line_lists_the_kernels_actions(lines: dict[str, re.Match[str]]) -> None:
    actions = Path("/proc/sys/kernel/seccomp/actions_avail").read_text().split()
    assert lines["seccomp"]["detail"].split()[: len(actions)] == actions
    needed = {"kill_process", "errno", "allow"} <= set(actions)
    assert (lines["seccomp"]["verdict"] == "ok") == needed


def test_seccomp_names_line_agrees_with_user_notif(lines: dict[str, re.Match[str]]) -> None:
    # naming a refused call needs the kernel's user notification (boxyd/stage2/notify.py)
    actions = Path("/proc/sys/kernel/seccomp/actions_avail").read_text().split()
    got = lines["seccomp-names"]
    assert (got["verdict"] == "ok") == ("user_notif" in actions), got.group(0)
    assert got["need"] == "optional", got.group(0)
    want = "every refused system call is named" if "user_notif" in actions else "cannot tell"
    assert want in got["detail"], got.group(0)


def test_userns_line_agrees_with_unshare(lines: dict[str, re.Match[str]]) -> None:
    works = as_user_ok(
        "unshare",
        "--map-current-user",
        "--mount",
        "--pid",
        "--fork",
        "--net",
        "--ipc",
        "--uts",
        "--cgroup",
        "true",
    )
    assert (lines["userns"]["verdict"] == "ok") == works


def test_nftables_line_agrees_with_nft(lines: dict[str, re.Match[str]]) -> None:
    nft = shutil.which("nft", path="/usr/sbin:/usr/bin:/sbin")
    assert nft is not None, "nft(8) is missing: make setup installs nftables"
    ruleset = (
        "add table inet t; add chain inet t pre { type filter hook prerouting "
        "priority -150; }; add rule inet t pre meta l4proto tcp tproxy ip to 127.0.0.1:1"
    )
    # A root-mapped namespace, so the exec'd nft keeps CAP_NET_ADMIN.
    works = as_user_ok("unshare", "--map-root-user", "--net", nft, ruleset)
    assert (lines["nftables"]["verdict"] == "ok") == works


def test_veth_line_agrees_with_ip(lines: dict[str, re.Match[str]]) -> None:
    assert shutil.which("ip", path="/usr/sbin:/usr/bin:/sbin"), (
        "ip(8) is missing: make setup installs iproute2"
    )
    works = as_user_ok(
        "unshare",
        "--map-root-user",
        "--net",
        "ip",
        "link",
        "add",
        "a0",
        "type",
        "veth",
        "peer",
        "name",
        "a1",
    )
    assert (lines["veth"]["verdict"] == "ok") == works


def test_apparmor_line_agrees_with_the_sysctl(lines: dict[str, re.Match[str]]) -> None:
    sysctl = Path("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
    if not sysctl.exists():
        assert lines["apparmor"]["verdict"] == "ok"
        assert lines["apparmor"]["detail"] == "not restricting user namespaces"
    elif sysctl.read_text().strip() == "1" and lines["apparmor"]["verdict"] == "missing":
        assert "make setup" in lines["apparmor"]["detail"]


def _cgroup2_root() -> Path | None:
    # statfs's f_type, a different source than the doctor's mountinfo parsing.
    for p in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        kind = subprocess.run(
            ["stat", "-f", "-c", "%T", p], capture_output=True, text=True, check=False
        ).stdout.strip()
        if kind == "cgroup2fs":
            return Path(p)
    return None


def test_cgroup2_line_agrees_with_the_controllers_file(
    lines: dict[str, re.Match[str]], facts: dict[str, object]
) -> None:
    root = _cgroup2_root()
    line = lines["cgroup2"]
    if root is None:
        assert line["verdict"] == "missing" and line["detail"].startswith("legacy")
        return
    rel = next(
        ln[3:] for ln in Path("/proc/self/cgroup").read_text().splitlines() if ln.startswith("0::")
    )
    path = root / rel.lstrip("/")
    have = set((path / "cgroup.controllers").read_text().split())
    assert facts["cgroup2_path"] == str(path)
    assert set(cast(list[str], facts["cgroup_controllers"])) == have
    for c in ("memory", "pids", "cpu"):
        assert facts[f"{c}_controller"] == (c in have)
    listed = re.search(r"\[([^]]*)\]", line["detail"])
    assert listed and set(listed.group(1).split()) == have, line.group(0)
    missing = [c for c in ("memory", "pids", "cpu") if c not in have]
    assert (line["verdict"] == "ok") == (not missing)
    if missing:
        assert f"has no {'/'.join(missing)} controller" in line["detail"]
        if "memory" in missing:
            assert "--memory is reported, not enforced" in line["detail"]


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def _listen(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen()
    return s


def test_user_manager_and_session_bus_found_by_their_sockets(runtime_dir: Path) -> None:
    (runtime_dir / "systemd").mkdir()
    with _listen(runtime_dir / "systemd" / "private"), _listen(runtime_dir / "bus"):
        got = parse(run_doctor(env={"XDG_RUNTIME_DIR": str(runtime_dir)}, as_user=False).stdout)
    assert got["systemd-user"]["verdict"] == "ok", got["systemd-user"].group(0)
    assert got["session-bus"]["detail"] == str(runtime_dir / "bus")
    # The listeners are closed: the files remain, and a stale socket is not a manager.
    got = parse(run_doctor(env={"XDG_RUNTIME_DIR": str(runtime_dir)}, as_user=False).stdout)
    assert got["systemd-user"]["verdict"] == "missing"
    assert got["session-bus"]["verdict"] == "missing"
    assert "varlink still works" in got["session-bus"]["detail"]


def test_missing_lines_are_red_only_on_a_terminal() -> None:
    results = [Check("a", True, "fine", False), Check("bb", False, "gone", False)]
    assert render(results) == [" + a   ok       optional  fine", " - bb  missing  optional  gone"]
    colored = render(results, color=True)
    assert colored[0] == " + a   ok       optional  fine"
    assert colored[1] == "\x1b[31m - bb  missing  optional  gone\x1b[0m"
    # And the real command decides by isatty: under a pty the '-' lines are red.
    master, slave = pty.openpty()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "TERM": "xterm"}
    proc = subprocess.Popen(
        [_python_for_user(), "-m", "boxyd.daemon.doctor"],
        stdout=slave,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd="/",
    )
    os.close(slave)
    out = b""
    while select.select([master], [], [], 10)[0]:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    proc.wait(timeout=10)
    assert proc.returncode in (0, 1)
    shown = out.decode().splitlines()
    assert len(shown) == len(NAMES)
    for ln in shown:
        plain = re.sub(r"\x1b\[[0-9;]*m", "", ln)
        if plain.startswith(" - "):
            assert ln.startswith("\x1b[31m") and ln.endswith("\x1b[0m"), repr(ln)
        else:
            assert ln == plain, repr(ln)


def test_host_network_lines_agree_with_the_host(lines: dict[str, re.Match[str]]) -> None:
    # /proc/net/ipv6_route read here with a plain search, not the doctor's parser
    routes = (
        Path("/proc/net/ipv6_route").read_text() if Path("/proc/net/ipv6_route").exists() else ""
    )
    default = any(
        ln.split()[0] == "0" * 32
        and ln.split()[1] == "00"
        and ln.split()[9] != "lo"
        and not int(ln.split()[8], 16) & 0x200
        for ln in routes.splitlines()
    )
    assert (lines["ipv6-route"]["verdict"] == "ok") == default
    resolvers = [
        ln.split()[1]
        for ln in Path("/etc/resolv.conf").read_text().splitlines()
        if ln.startswith("nameserver")
    ]
    if resolvers:
        assert lines["dns-upstream"]["verdict"] == "ok"
        assert resolvers[0] in lines["dns-upstream"]["detail"]


@pytest.mark.parametrize("value,ok", [(None, False), ("explicit", True), ("all", False)])
def test_git_line_agrees_with_git_config(tmp_path: Path, value: str | None, ok: bool) -> None:
    if value is not None:
        (tmp_path / ".gitconfig").write_text(f"[safe]\n\tbareRepository = {value}\n")
    r = run_doctor(as_user=False, env={"HOME": str(tmp_path)})
    line = parse(r.stdout)["git"]
    assert (line["verdict"] == "ok") is ok, r.stdout
    assert f"safe.bareRepository={value or 'all (unset)'}" in line["detail"]


def test_lines_say_required_or_optional_and_how_to_get_what_is_missing(
    lines: dict[str, re.Match[str]],
) -> None:
    from boxy.checks import TO_GET_IT

    for name, m in lines.items():
        assert (m["need"] == "required") == (name in HARD), m.group(0)
        if m["verdict"] == "missing":
            assert m["detail"].endswith(f"; to get it: {TO_GET_IT[name]}"), m.group(0)
    assert set(TO_GET_IT) == set(NAMES) - {"kernel"}


@pytest.mark.sandbox
def test_boxyctl_doctor_asks_boxyd(user: User) -> None:
    """Issue 32 §3: the client runs no check of its own when boxyd answers: Doctor runs
    them beside the daemon (in its session, cgroup and environment), and the client
    prints what came back: the checks the same user's probe finds."""
    r = user.run([str(BIN / "boxyctl"), "doctor", "--json"], timeout=60)
    assert b"could not be reached" not in r.stderr, r.stderr
    got = json.loads(r.stdout)
    probe = user.run([str(BIN / "python3"), "-m", "boxyd.daemon.doctor", "--wire"], timeout=60)
    want = json.loads(probe.stdout)
    assert [(c["name"], c["ok"]) for c in got["checks"]] == [(c["name"], c["ok"]) for c in want]
    assert tuple(c["name"] for c in got["checks"]) == NAMES
    assert r.returncode == (0 if got["ok"] else 1)


@pytest.mark.parametrize(("veth", "nft"), [(True, True), (True, False), (False, True)])
def test_the_network_line_names_the_path_part_by_part(veth: bool, nft: bool) -> None:
    """Issue 33 §1: the line for the network path (the specification's `tun`): what
    boxy's path needs, each part from its own probe, and what a missing one costs."""
    facts: dict[str, object] = {"veth": veth, "nftables_tproxy": nft}
    (line,) = doctor._network_path(facts)
    assert line.ok == (veth and nft) and not line.hard
    assert ("rtnetlink" in line.detail) == (not veth or veth and nft)
    assert ("--net none works" in line.detail) == (not (veth and nft))


def test_the_network_line_agrees_with_the_veth_and_nftables_lines(
    lines: dict[str, re.Match[str]],
) -> None:
    both = lines["veth"]["verdict"] == lines["nftables"]["verdict"] == "ok"
    assert (lines["network"]["verdict"] == "ok") == both, lines["network"].group(0)
