"""What boxyctl, boxyd and stage 2 share: errors, typed values, paths, the build id,
the varlink wire and the request and outcome of a run. Standard library only, and
nothing here imports boxyd or boxyctl.

This is also the Python library: `boxy.run`, `boxy.start`, `boxy.spawn_pty` and the
rest (boxy.library; boxy.aio for asyncio). They load on first use: boxyctl imports
this package on every run, and start-up time is part of every run.
"""

from boxy.ident import INTERFACE, VERSION

TYPE_CHECKING = False  # typing costs the client 4 ms at start-up; annotations only
if TYPE_CHECKING:
    from boxy.errors import (
        BoxyError,
        BuildMismatch,
        Busy,
        DaemonError,
        NoSuchSession,
        ProfileError,
        SecretsNeeded,
        SetupError,
        UsageError,
    )
    from boxy.library import (
        DEVNULL,
        PIPE,
        Result,
        SandboxedPTY,
        Session,
        attach,
        run,
        sessions,
        show,
        spawn_pty,
        start,
        stop,
        watch,
    )

_LIBRARY = (
    "DEVNULL", "PIPE", "Result", "SandboxedPTY", "Session", "attach", "run", "sessions",
    "show", "spawn_pty", "start", "stop", "watch",
)  # fmt: skip
_ERRORS = (
    "BoxyError", "BuildMismatch", "Busy", "DaemonError", "NoSuchSession", "ProfileError",
    "SecretsNeeded", "SetupError", "UsageError",
)  # fmt: skip
__all__ = [
    "INTERFACE", "VERSION",
    "DEVNULL", "PIPE", "Result", "SandboxedPTY", "Session", "attach", "run", "sessions",
    "show", "spawn_pty", "start", "stop", "watch",
    "BoxyError", "BuildMismatch", "Busy", "DaemonError", "NoSuchSession", "ProfileError",
    "SecretsNeeded", "SetupError", "UsageError",
]  # fmt: skip


def __getattr__(name: str) -> object:
    """The library's names, loaded when first asked for."""
    if name in _LIBRARY:
        from boxy import library

        return getattr(library, name)
    if name in _ERRORS:
        from boxy import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'boxy' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
