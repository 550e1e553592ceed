"""boxyd.config.envpolicy: nothing from the client's environment but presentation variables."""

from collections.abc import Iterable
from typing import Any

import pytest

from boxy.errors import UsageError
from boxyd.config.envpolicy import SYSTEM_PATH, is_sensitive, sandbox_env

CLIENT = {
    "TERM": "xterm-256color",
    "LANG": "en_GB.UTF-8",
    "LANGUAGE": "en_GB",
    "LC_ALL": "C.UTF-8",
    "LC_TIME": "de_DE.UTF-8",
    "TZ": "Europe/Berlin",
    "COLORTERM": "truecolor",
    "NO_COLOR": "1",
    "HOME": "/home/client",
    "USER": "client",
    "PATH": "/home/client/bin:/usr/bin",
    "SHELL": "/usr/bin/zsh",
    "TMPDIR": "/home/client/tmp",
    "SSH_AUTH_SOCK": "/run/user/1000/ssh",
    "GPG_AGENT_INFO": "x",
    "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/1000/bus",
    "XDG_RUNTIME_DIR": "/run/user/1000",
    "DISPLAY": ":0",
    "WAYLAND_DISPLAY": "wayland-0",
    "DOCKER_HOST": "unix:///run/docker.sock",
    "GITHUB_TOKEN": "ghp_x",
    "NPM_TOKEN": "npm_x",
    "AWS_ACCESS_KEY_ID": "AKIA",
    "AWS_REGION": "eu-west-1",
    "GOOGLE_APPLICATION_CREDENTIALS": "/k.json",
    "AZURE_CLIENT_ID": "x",
    "ANTHROPIC_API_KEY": "sk-ant",
    "DB_PASSWORD": "hunter2",
    "MY_SECRET": "s",
    "EDITOR": "vim",
}


def env(requested: Iterable[tuple[str, str | None]] = (), **kw: Any) -> dict[str, str]:
    kw.setdefault("home", "/home/u")
    kw.setdefault("user", "u")
    return sandbox_env(CLIENT, list(requested), **kw)


def test_default_is_presentation_plus_fixed() -> None:
    assert env() == {
        "TERM": "xterm-256color",
        "LANG": "en_GB.UTF-8",
        "LANGUAGE": "en_GB",
        "LC_ALL": "C.UTF-8",
        "LC_TIME": "de_DE.UTF-8",
        "TZ": "Europe/Berlin",
        "COLORTERM": "truecolor",
        "NO_COLOR": "1",
        "HOME": "/home/u",
        "USER": "u",
        "LOGNAME": "u",
        "SHELL": "/bin/sh",
        "PATH": "/home/u/.local/bin:" + SYSTEM_PATH,
    }


def test_tmpdir_never_set() -> None:
    assert "TMPDIR" not in env(profile_env={"A": "b"})


def test_path_override() -> None:
    assert env(path="/opt/bin")["PATH"] == "/opt/bin"


def test_explicit_values_override_everything() -> None:
    result = env([("PATH", "/x"), ("HOME", "/h"), ("TERM", "dumb"), ("FOO", "bar")])
    assert result["PATH"] == "/x"
    assert result["HOME"] == "/h"
    assert result["TERM"] == "dumb"
    assert result["FOO"] == "bar"


@pytest.mark.parametrize(
    "name",
    [
        "SSH_AUTH_SOCK",
        "GITHUB_TOKEN",
        "AWS_ACCESS_KEY_ID",
        "ANTHROPIC_API_KEY",
        "DISPLAY",
        "EDITOR",
    ],
)
def test_named_with_e_takes_the_client_value(name: str) -> None:
    assert env([(name, None)])[name] == CLIENT[name]


def test_missing_named_variable_is_skipped_with_a_note() -> None:
    notes: list[str] = []
    result = env([("NOPE", None)], notes=notes)
    assert "NOPE" not in result
    assert notes == ["-e NOPE: not set in your environment; skipped"]


@pytest.mark.parametrize("name", list(CLIENT))
def test_sensitive_never_leaks_by_default(name: str) -> None:
    result = env(env_pass=[name] if not is_sensitive(name) else [])
    if is_sensitive(name):
        assert name not in result


@pytest.mark.parametrize(
    "name",
    [
        "SSH_AUTH_SOCK",
        "GPG_AGENT_INFO",
        "DBUS_SESSION_BUS_ADDRESS",
        "XDG_RUNTIME_DIR",
        "DISPLAY",
        "WAYLAND_DISPLAY",
        "DOCKER_HOST",
        "GITHUB_TOKEN",
        "my_token",
        "MY_SECRET",
        "ANTHROPIC_API_KEY",
        "DB_PASSWORD",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "AWS_REGION",
        "AZURE_CLIENT_ID",
        "GIT_CREDENTIAL_HELPER",
    ],
)
def test_is_sensitive(name: str) -> None:
    assert is_sensitive(name)


@pytest.mark.parametrize("name", ["TERM", "LANG", "EDITOR", "NODE_ENV", "PATH"])
def test_not_sensitive(name: str) -> None:
    assert not is_sensitive(name)


def test_env_pass_refuses_sensitive_names() -> None:
    notes: list[str] = []
    result = env(env_pass=["GITHUB_TOKEN", "EDITOR", "UNSET"], notes=notes)
    assert "GITHUB_TOKEN" not in result
    assert result["EDITOR"] == "vim"
    assert any("GITHUB_TOKEN" in n and "-e GITHUB_TOKEN" in n for n in notes)
    assert any("UNSET" in n and "not set" in n for n in notes)


def test_precedence_profile_env_then_flags() -> None:
    result = env([("A", "flag")], profile_env={"A": "profile", "B": "profile"}, env_pass=["EDITOR"])
    assert result["A"] == "flag"
    assert result["B"] == "profile"


def test_profile_env_beats_env_pass() -> None:
    assert env(profile_env={"EDITOR": "nano"}, env_pass=["EDITOR"])["EDITOR"] == "nano"


@pytest.mark.parametrize("name", ["1X", "A-B", "A=B", "", "A B", "Ä"])
def test_bad_names_refused(name: str) -> None:
    with pytest.raises(UsageError, match="not a valid variable name"):
        env([(name, "v")])
    with pytest.raises(UsageError, match="not a valid variable name"):
        env(profile_env={name: "v"})
    with pytest.raises(UsageError, match="not a valid variable name"):
        env(env_pass=[name])


def test_nul_in_value_refused() -> None:
    with pytest.raises(UsageError, match="NUL"):
        env([("A", "a\0b")])
    with pytest.raises(UsageError, match="NUL"):
        env(profile_env={"A": "a\0b"})


def test_bad_client_values_are_dropped_not_fatal() -> None:
    result = sandbox_env({"TERM": "a\0b", "LC_BAD-NAME": "x"}, [], home="/h", user="u")
    assert "TERM" not in result and "LC_BAD-NAME" not in result
