"""One exception type per boundary, each with a message a user can act on, and the
one table that names them on the wire (varlink and D-Bus alike).

The daemon raises these; an adapter turns one into an error reply with `to_wire`,
and the client turns the reply back into the same exception with `from_wire`.
"""

from __future__ import annotations

from boxy.ident import INTERFACE

TYPE_CHECKING = False  # typing costs the client 4 ms at start-up; annotations only
if TYPE_CHECKING:
    from typing import Any

VARLINK_PREFIX = INTERFACE + "."
DBUS_PREFIX = "dev.boxy.Error."


class BoxyError(Exception):
    """Base of every error boxy reports to a user (never shown as a traceback)."""

    exit_status = 1

    def parameters(self) -> dict[str, Any]:
        """What the error reply carries besides its name."""
        return {"message": str(self)}

    @classmethod
    def from_parameters(cls, params: dict[str, Any]) -> BoxyError:
        return cls(str(params.get("message") or cls.__name__))


class UsageError(BoxyError):
    """Bad input: an unknown flag, a bad size, a missing path, an impossible combination.

    Refused before anything starts; the client prints the one line and exits 2.
    """

    exit_status = 2


class ProfileError(UsageError):
    """An invalid profile: the message names the file, the key and what was expected."""


class DaemonError(BoxyError):
    """The client could not reach, start or trust boxyd."""


class SetupError(BoxyError):
    """A sandbox layer could not be applied; the run stops (layers never fail open)."""


class NoSuchSession(BoxyError):
    """No session has this id (neither running nor among the kept records)."""

    def __init__(self, sid: str) -> None:
        super().__init__(f"no session {sid} (`boxyctl ps -a` lists them)")
        self.sid = sid

    def parameters(self) -> dict[str, Any]:
        return {"message": str(self), "id": self.sid}

    @classmethod
    def from_parameters(cls, params: dict[str, Any]) -> BoxyError:
        return cls(str(params.get("id", "")))


class Busy(BoxyError):
    """The daemon refuses to stop while sessions run (without --force)."""


class BuildMismatch(DaemonError):
    """Client and daemon come from different builds: the daemon refuses the call."""

    def __init__(self, daemon_build: str, client_build: str) -> None:
        super().__init__(f"boxyd is build {daemon_build}, this client is build {client_build}")
        self.daemon_build = daemon_build
        self.client_build = client_build

    def parameters(self) -> dict[str, Any]:
        return {
            "message": str(self),
            "daemon_build": self.daemon_build,
            "client_build": self.client_build,
        }

    @classmethod
    def from_parameters(cls, params: dict[str, Any]) -> BoxyError:
        return cls(str(params.get("daemon_build", "")), str(params.get("client_build", "")))


class SecretsNeeded(UsageError):
    """The profile passes variables by name that the client did not send: secrets
    (env_secrets, NAMES) and plain ones (env_pass, PASSED). It sends them from its
    environment, says which it does not have, and asks again. Names, never a value."""

    def __init__(self, names: list[str], profile: str, passed: list[str] | None = None) -> None:
        what = [f"env_secrets {', '.join(names)}"] if names else []
        what += [f"env_pass {', '.join(passed)}"] if passed else []
        super().__init__(
            f"profile {profile}: {'; '.join(what)}: boxyctl passes them from its environment"
        )
        self.names, self.profile, self.passed = names, profile, list(passed or [])

    def parameters(self) -> dict[str, Any]:
        return {
            "message": str(self),
            "names": self.names,
            "profile": self.profile,
            "passed": self.passed,
        }

    @classmethod
    def from_parameters(cls, params: dict[str, Any]) -> BoxyError:
        def names(key: str) -> list[str]:
            got = params.get(key)
            return [str(n) for n in got] if isinstance(got, list) else []

        return cls(names("names"), str(params.get("profile", "")), names("passed"))


class InternalError(BoxyError):
    """A bug in boxyd; the message says so and points at its log."""


# The table. The most specific class wins (ProfileError before UsageError); a
# BoxyError not listed is sent as the nearest listed base.
ERRORS: tuple[tuple[type[BoxyError], str], ...] = (
    (SecretsNeeded, "SecretsNeeded"),
    (ProfileError, "InvalidProfile"),
    (UsageError, "InvalidArgument"),
    (SetupError, "SetupFailed"),
    (NoSuchSession, "NoSuchSession"),
    (Busy, "Busy"),
    (BuildMismatch, "BuildMismatch"),
    (DaemonError, "DaemonFailed"),
    (InternalError, "InternalError"),
    (BoxyError, "Failed"),
)
_BY_NAME = {name: cls for cls, name in ERRORS}


def short_name(exc: BoxyError) -> str:
    """The table's name for EXC: the first row whose class EXC is an instance of."""
    return next(name for cls, name in ERRORS if isinstance(exc, cls))


def varlink_error(exc: BoxyError) -> tuple[str, dict[str, Any]]:
    """(error name, parameters) of the varlink error reply for EXC."""
    return VARLINK_PREFIX + short_name(exc), exc.parameters()


def dbus_error_name(exc: BoxyError) -> str:
    return DBUS_PREFIX + short_name(exc)


def from_wire(name: str, params: dict[str, Any]) -> BoxyError | None:
    """The exception an error reply NAME (varlink or D-Bus) stands for; None for a
    name outside the table (org.varlink.service.*, or a newer daemon's)."""
    for prefix in (VARLINK_PREFIX, DBUS_PREFIX):
        if name.startswith(prefix) and name[len(prefix) :] in _BY_NAME:
            return _BY_NAME[name[len(prefix) :]].from_parameters(params)
    return None
