"""boxyd.config.exposure: no exposed tree may hold an agent, bus or engine socket."""

import pytest

from boxy.errors import UsageError
from boxyd.config.exposure import check_exposed, sensitive_paths

HOME = "/home/u"
ENV = {
    "SSH_AUTH_SOCK": "/tmp/ssh-XYZ/agent.123",
    "XDG_RUNTIME_DIR": "/run/user/1000",
    "DOCKER_HOST": "unix:///srv/docker/docker.sock",
    "DBUS_SESSION_BUS_ADDRESS": "unix:path=/var/lib/bus%2dsock,guid=abc;tcp:host=x,port=1",
}


def paths(env=ENV, home=HOME, uid=1000):
    return dict(sensitive_paths(env, home, uid))


def test_sensitive_paths_from_environment():
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


def test_defaults_without_environment():
    found = paths(env={}, uid=1234)
    assert "/run/user/1234" in found
    assert "/run/user/1234/gnupg" in found
    assert "/home/u/.gnupg" in found
    assert not any("ssh" in p for p in found)


def test_gnupghome_and_relative_values_ignored():
    found = paths(
        env={"GNUPGHOME": "/keys/gpg", "SSH_AUTH_SOCK": "relative", "XDG_RUNTIME_DIR": "x"}
    )
    assert "/keys/gpg" in found and "/home/u/.gnupg" not in found
    assert "relative" not in found
    assert "/run/user/1000" in found


def test_dbus_abstract_and_tcp_ignored():
    found = paths(env={"DBUS_SESSION_BUS_ADDRESS": "unix:abstract=/tmp/dbus-x;tcp:host=h,port=1"})
    assert "/tmp/dbus-x" not in found


def test_no_duplicates():
    listed = [p for p, _ in sensitive_paths({"XDG_RUNTIME_DIR": "/run/user/1000/"}, HOME, 1000)]
    assert len(listed) == len(set(listed))


def check(exposed, realpath=lambda p: p, exists=lambda p: True):
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
def test_exposing_a_sensitive_tree_is_refused(exposed, hit):
    with pytest.raises(UsageError) as e:
        check([exposed])
    assert f"{exposed[0]} {exposed[1]}: exposes {hit} (" in str(e.value)
    assert str(e.value).endswith("expose a narrower path")


def test_message_shape():
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
def test_the_home_directory_is_the_reason_given_first(exposed, verb):
    """Running from $HOME or / names the real reason, not a socket inside."""
    with pytest.raises(UsageError) as e:
        check([exposed])
    assert str(e.value).startswith(
        f"{exposed[0]} {exposed[1]}: {verb} your home directory /home/u, "
        "whose keys and credentials are never exposed; run in a project"
    )


def test_absent_sensitive_paths_are_never_named():
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
def test_narrower_paths_pass(path):
    check([("--ro", path)])


def test_symlinks_are_resolved_on_both_sides():
    links = {"/home/u/link": "/run/user/1000", "/var/run": "/run"}

    def realpath(p):
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
