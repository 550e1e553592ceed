"""One exception type per boundary, each with a message a user can act on."""


class BoxyError(Exception):
    """Base of every error boxy reports to a user (never shown as a traceback)."""

    exit_status = 1


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
