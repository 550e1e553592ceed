"""boxyd.config.exposure: no exposed tree may hold an agent, bus or engine socket."""

import socket
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pytest

from boxy.errors import UsageError
from boxyd.config import exposure
from boxyd.config.exposure import (
    Exposed,
    SocketMemo,
    check_exposed,
    refuse_sockets,
    sensitive_paths,
)

HOME = "/home/u"
ENV = {
    "SSH_AUTH_SOCK": "/tmp/ssh-XYZ/agent.123",
    "XDG_RUNTIME_DIR": "/run/user/1000",
    "DOCKER_HOST": "unix:///srv/docker/docker.sock",
    "DBUS_SESSION_BUS_ADDRESS": "unix:path=/var/lib/bus%2dsock,guid=abc;tcp:host=x,port=1",
}


def paths(env: Mapping[str, str] = ENV, home: str = HOME, uid: int = 1000) -> dict[str, str]:
    return dict(sensitive_paths(env, home, uid))


def test_sensitive_paths_from_environment() -> None:
    found = paths()
    assert found["/tmp/ssh-XYZ/agent.123"] == "SSH agent socket"
    assert "/home/u/.gnupg" in found
    assert "/run/user/1000/gnupg" in found
    assert "/run/user/1000" in found
    assert "/run/user/1000/docker.sock" in found
    assert "/run/user/1000/podman" in found
    assert "/srv/docker/docker.sock" in found
    assert "/var/lib/bus-sock" in found  # %2d unescaped
    for fixed in ["/run", "/var/run", "/var/run/docker.sock", "/run/docker.sock"]:
        assert fixed in found


def test_defaults_without_environment() -> None:
    found = paths(env={}, uid=1234)
    assert "/run/user/1234" in found
    assert "/run/user/1234/gnupg" in found
    assert "/home/u/.gnupg" in found
    assert not any("ssh" in p for p in found)


def test_gnupghome_and_relative_values_ignored() -> None:
    found = paths(
        env={"GNUPGHOME": "/keys/gpg", "SSH_AUTH_SOCK": "relative", "XDG_RUNTIME_DIR": "x"}
    )
    assert "/keys/gpg" in found and "/home/u/.gnupg" not in found
    assert "relative" not in found
    assert "/run/user/1000" in found


def test_dbus_abstract_and_tcp_ignored() -> None:
    found = paths(env={"DBUS_SESSION_BUS_ADDRESS": "unix:abstract=/tmp/dbus-x;tcp:host=h,port=1"})
    assert "/tmp/dbus-x" not in found


def test_no_duplicates() -> None:
    listed = [p for p, _ in sensitive_paths({"XDG_RUNTIME_DIR": "/run/user/1000/"}, HOME, 1000)]
    assert len(listed) == len(set(listed))


def check(
    exposed: Iterable[Exposed],
    realpath: Callable[[str], str] = lambda p: p,
    exists: Callable[[str], bool] = lambda p: True,
) -> None:
    check_exposed(exposed, sensitive_paths(ENV, HOME, 1000), realpath=realpath, exists=exists)


@pytest.mark.parametrize(
    "exposed,hit",
    [
        (("--ro", "/home/u/.gnupg"), "/home/u/.gnupg"),
        (("--ro", "/tmp"), "/tmp/ssh-XYZ/agent.123"),
        (("--ro", "/tmp/ssh-XYZ"), "/tmp/ssh-XYZ/agent.123"),
        (("--ro", "/run/user"), "/run/user/1000/gnupg"),
        (("--ro", "/run/user/1000/bus"), "/run/user/1000/bus"),
        (("--ro", "/run/podman"), "/run/podman"),
        (("--ro", "/var"), "/var/lib/bus-sock"),
        (("--ro", "/var/run"), "/var/run/docker.sock"),
        (("--ro", "/srv/docker"), "/srv/docker/docker.sock"),
        (("workdir", "/var/lib"), "/var/lib/bus-sock"),
        (("--mkdir", "/run"), "/run/user/1000/gnupg"),
        (("--ro", "/tmp/.X11-unix"), "/tmp/.X11-unix"),
    ],
)
def test_exposing_a_sensitive_tree_is_refused(exposed: Exposed, hit: str) -> None:
    with pytest.raises(UsageError) as e:
        check([exposed])
    assert f"{exposed[0]} {exposed[1]}: exposes {hit} (" in str(e.value)
    assert str(e.value).endswith("expose a narrower path")


def test_message_shape() -> None:
    with pytest.raises(UsageError) as e:
        check([("--ro", "/home/u/.gnupg")])
    assert str(e.value) == (
        "--ro /home/u/.gnupg: exposes /home/u/.gnupg (GPG home and agent socket); expose a narrower path"
    )


@pytest.mark.parametrize(
    "exposed,verb",
    [
        (("workdir", "/home/u"), "is"),
        (("workdir", "/"), "holds"),
        (("--rw", "/home"), "holds"),
        (("--ro", "/home/u"), "is"),
    ],
)
def test_the_home_directory_is_the_reason_given_first(exposed: Exposed, verb: str) -> None:
    """Running from $HOME or / names the real reason, not a socket inside."""
    with pytest.raises(UsageError) as e:
        check([exposed])
    assert str(e.value).startswith(
        f"{exposed[0]} {exposed[1]}: {verb} your home directory /home/u, "
        "whose keys and credentials are never exposed; run in a project"
    )


def test_absent_sensitive_paths_are_never_named() -> None:
    present = {"/tmp"}
    with pytest.raises(UsageError) as e:
        check([("workdir", "/tmp")], exists=lambda p: p in present)
    assert "exposes /tmp (the shared /tmp" in str(e.value)
    check([("--ro", "/tmp/.X11-unix")], exists=lambda p: p in present)  # absent: nothing to name


@pytest.mark.parametrize(
    "path",
    [
        "/home/u/project",
        "/home/u/.gnupgx",
        "/tmp/ssh-XYZ2",
        "/run/systemd/resolve",
        "/usr",
        "/home/u/.ssh2",
        "/mnt",
    ],
)
def test_narrower_paths_pass(path: str) -> None:
    check([("--ro", path)])


def test_symlinks_are_resolved_on_both_sides() -> None:
    links = {"/home/u/link": "/run/user/1000", "/var/run": "/run"}

    def realpath(p: str) -> str:
        return links.get(p, p)

    with pytest.raises(UsageError, match="exposes /run/user/1000"):
        check([("--ro", "/home/u/link")], realpath)
    # a home reached through a symlink still contains ~/.gnupg
    sens = sensitive_paths({}, "/home/u", 1000)
    with pytest.raises(UsageError, match="your home directory /home/u"):
        check_exposed(
            [("--ro", "/data/homes/u")],
            sens,
            realpath=lambda p: {"/data/homes/u": "/home/u"}.get(p, p),
            exists=lambda p: True,
        )
    # a sensitive path that resolves into the exposed tree is caught too
    with pytest.raises(UsageError, match="/home/u/.gnupg"):
        check_exposed(
            [("--ro", "/keys")],
            sens,
            realpath=lambda p: {"/home/u/.gnupg": "/keys/gnupg"}.get(p, p),
            exists=lambda p: True,
        )


def test_the_home_directory_itself_is_never_exposed() -> None:
    sens = sensitive_paths({}, "/home/u", 1000)
    for label, path in (("workdir", "/home/u"), ("--ro", "/home"), ("--rw", "/")):
        with pytest.raises(UsageError, match="your home directory"):
            check_exposed([(label, path)], sens, realpath=lambda p: p, exists=lambda p: True)
    check_exposed(
        [("workdir", "/home/u/project")], sens, realpath=lambda p: p, exists=lambda p: True
    )


# --- the socket walk and its memo --------------------------------------------------

FAR_FUTURE = 1 << 62  # a clock past every ctime: each directory read is kept


def _tree(root: Path) -> Path:
    for sub in ("a/b/c", "a/d", "e"):
        (root / sub).mkdir(parents=True)
        (root / sub / "f").write_text("x")
    return root


def _bind(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return s


def test_only_changed_directories_are_read_again(tmp_path: Path) -> None:
    tree, memo = _tree(tmp_path / "t"), SocketMemo(clock=lambda: FAR_FUTURE)
    refuse_sockets("--ro", str(tree), memo=memo)
    assert memo.reads == 6  # t, a, a/b, a/b/c, a/d, e
    refuse_sockets("--ro", str(tree), memo=memo)
    assert memo.reads == 6  # nothing changed: nothing read
    (tree / "a/b/g").write_text("y")  # a/b's ctime moves
    refuse_sockets("--ro", str(tree), memo=memo)
    assert memo.reads == 7


@pytest.mark.parametrize("where", ["a/b/c", "a/d/new/deeper", "e"])
def test_a_socket_added_under_remembered_directories_is_found(tmp_path: Path, where: str) -> None:
    tree, memo = _tree(tmp_path / "t"), SocketMemo(clock=lambda: FAR_FUTURE)
    refuse_sockets("--ro", str(tree), memo=memo)
    (tree / where).mkdir(parents=True, exist_ok=True)
    with _bind(tree / where / "agent.sock"), pytest.raises(UsageError) as e:
        refuse_sockets("--ro", str(tree), memo=memo)
    assert str(e.value) == (
        f"--ro {tree}: holds the unix socket {tree}/{where}/agent.sock, which the sandbox "
        "could connect to; expose a narrower path"
    )


def test_a_directory_read_soon_after_its_change_is_read_again(tmp_path: Path) -> None:
    # the real clock: these directories changed within RACY_NS of their reading (a
    # change in the same tick would leave the ctime as it was read)
    tree, memo = _tree(tmp_path / "t"), SocketMemo()
    refuse_sockets("--ro", str(tree), memo=memo)
    refuse_sockets("--ro", str(tree), memo=memo)
    assert memo.reads == 12


def test_a_remembered_tree_still_counts_towards_the_limit(tmp_path: Path) -> None:
    tree, memo = _tree(tmp_path / "t"), SocketMemo(clock=lambda: FAR_FUTURE)
    refuse_sockets("--ro", str(tree), limit=8, memo=memo)  # 8 entries
    with pytest.raises(UsageError, match="too large to check for unix sockets \\(over 7 "):
        refuse_sockets("--ro", str(tree), limit=7, memo=memo)
    assert memo.reads == 6


def test_the_memo_is_bounded(tmp_path: Path) -> None:
    tree, memo = _tree(tmp_path / "t"), SocketMemo(clock=lambda: FAR_FUTURE, limit=4)
    for _ in range(3):
        refuse_sockets("--ro", str(tree), memo=memo)
        assert len(memo) <= 4
    with _bind(tree / "a/d/agent.sock"), pytest.raises(UsageError, match="agent.sock"):
        refuse_sockets("--ro", str(tree), memo=memo)


def test_symlinks_below_the_tree_are_not_followed_the_tree_itself_is(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    tree = _tree(tmp_path / "t")
    (tree / "a/link").symlink_to(outside)  # resolves nowhere in the sandbox
    (tmp_path / "via").symlink_to(tree)
    with _bind(outside / "agent.sock"):
        refuse_sockets("--ro", str(tree), memo=SocketMemo())
    with _bind(tree / "e/agent.sock"), pytest.raises(UsageError, match="e/agent.sock"):
        refuse_sockets("--ro", str(tmp_path / "via"), memo=SocketMemo())


def test_writable_trees_never_hold_or_lie_in_the_settings_boxy_obeys() -> None:
    env = {"XDG_STATE_HOME": "/home/u/st"}
    own = {"XDG_CONFIG_HOME": "/home/u/dots/cfg"}  # boxyd's own (systemd's environment.d)
    settings = exposure.settings_paths(env, "/home/u", own)
    paths = [p for p, _ in settings]
    assert paths == [
        "/home/u/.config",
        "/home/u/.claude",
        "/home/u/st/boxy",
        "/home/u/.local/share/systemd/user",
        "/home/u/.local/share/dbus-1",
        "/home/u/dots/cfg",
        "/home/u/.local/state/boxy",
    ]
    same = {"realpath": lambda p: p}
    for bad in (
        "/home/u/.config",
        "/home/u/.config/boxy",
        "/home/u/st",
        "/home/u/.claude/x",
        "/home/u/dots",
        "/home/u/.local/share",
    ):
        with pytest.raises(UsageError, match="would let the run rewrite"):
            exposure.check_writable([("workdir", bad)], settings, **same)
    exposure.check_writable(
        [("workdir", "/home/u/proj"), ("--rw", "/home/u/st2")], settings, **same
    )
    assert exposure.settings_paths({}, "/", {}) == []
