"""The payload's environment: built from nothing, never inherited.

Pure. A hostile payload reads its environment first (tokens, agent sockets), so
only presentation variables (terminal, locale, time zone, colour) come from the
client; everything else is either fixed here or named explicitly with ``-e``.
Precedence, lowest first: pass-through < fixed (HOME, USER, PATH …) < profile
``env_pass`` < profile ``env`` < ``-e`` flags.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping

from boxy.errors import UsageError

# Harmless and needed for a usable terminal; the only names ever taken by default.
PASSTHROUGH = ("TERM", "LANG", "LANGUAGE", "TZ", "COLORTERM", "NO_COLOR")
PASSTHROUGH_PREFIXES = ("LC_",)

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
# Scripts expect a POSIX shell; the user's login shell may need rc files that are absent.
SANDBOX_SHELL = "/bin/sh"

# Reach only with an explicit -e NAME: a profile's env_pass cannot pull these in.
NEVER_BY_DEFAULT = (
    "SSH_AUTH_SOCK",
    "SSH_AGENT_PID",
    "GPG_AGENT_INFO",
    "DBUS_SESSION_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "XAUTHORITY",
    "DOCKER_HOST",
    "*TOKEN*",
    "*SECRET*",
    "*KEY*",
    "*PASSWORD*",
    "*PASSWD*",
    "*CREDENTIAL*",
    "AWS_*",
    "GOOGLE_*",
    "AZURE_*",
)

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_name(name: str, *, what: str = "-e") -> str:
    """An environment variable name as POSIX shells accept it."""
    if not _NAME_RE.fullmatch(name):
        raise UsageError(f"{what} {name!r}: not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)")
    return name


def check_value(name: str, value: str, *, what: str = "-e") -> str:
    if "\0" in value:
        raise UsageError(f"{what} {name}: the value contains a NUL byte")
    return value


def is_sensitive(name: str) -> bool:
    """True for a name that must be named with -e to reach the sandbox."""
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in NEVER_BY_DEFAULT)


def is_passthrough(name: str) -> bool:
    return (name in PASSTHROUGH or name.startswith(PASSTHROUGH_PREFIXES)) and not is_sensitive(name)


def sandbox_path(home: str) -> str:
    # ~/.local/bin first: where per-user installs (pip --user, the claude binary) live.
    return f"{home.rstrip('/')}/.local/bin:{SYSTEM_PATH}"


def sandbox_env(
    client_env: Mapping[str, str],
    requested: Iterable[tuple[str, str | None]],
    *,
    home: str,
    user: str,
    path: str | None = None,
    profile_env: Mapping[str, str] | None = None,
    env_pass: Iterable[str] = (),
    notes: list[str] | None = None,
) -> dict[str, str]:
    """The payload's final environment.

    ``requested`` is the ``-e`` flags in order: ``(NAME, VALUE)`` sets, ``(NAME, None)``
    takes NAME from ``client_env`` and is skipped, with a note appended to ``notes``,
    when the client has no such variable. ``env_pass`` (a profile's) also reads
    ``client_env`` but never brings in a sensitive name. TMPDIR is never set: /tmp
    is the sandbox's own.
    """
    notes = notes if notes is not None else []
    env: dict[str, str] = {}
    for name, value in client_env.items():
        if is_passthrough(name) and _NAME_RE.fullmatch(name) and "\0" not in value:
            env[name] = value
    env.update(
        HOME=home,
        USER=user,
        LOGNAME=user,
        SHELL=SANDBOX_SHELL,
        PATH=path if path is not None else sandbox_path(home),
    )
    for name in env_pass:
        check_name(name, what="env_pass")
        if is_sensitive(name):
            notes.append(
                f"env_pass {name}: not passed (sensitive names need an explicit -e {name})"
            )
        elif name in client_env:
            env[name] = check_value(name, client_env[name], what="env_pass")
        else:
            notes.append(f"env_pass {name}: not set in the client's environment; skipped")
    for name, value in (profile_env or {}).items():
        env[check_name(name, what="profile env")] = check_value(name, value, what="profile env")
    for name, given in requested:
        check_name(name)
        if given is None:
            if name not in client_env:
                notes.append(f"-e {name}: not set in your environment; skipped")
                continue
            given = client_env[name]
        env[name] = check_value(name, given)
    return env
