"""What every client of boxyd does (boxyctl and the library alike): reach boxyd
(verify the front door, start the daemon on demand), say which part of its
environment a run sees, and send a run with the answers a first try can get
(the profile's secrets, a daemon of another build).

Standard library only and no asyncio: boxyctl imports this on every run."""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import time

from boxy import stdfds
from boxy.errors import BoxyError, BuildMismatch, Busy, DaemonError, SecretsNeeded, UsageError
from boxy.ident import INTERFACE
from boxy.paths import (
    ensure_private_dir,
    inside_sandbox,
    runtime_base_problem,
    runtime_dir_str,
    socket_path_str,
    state_dir_str,
)
from boxy.varlink import Client, DaemonUnavailable

TYPE_CHECKING = False  # typing costs the client 4 ms at start-up; annotations only
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, TypeVar

    from boxy.outcome import RunReply
    from boxy.request import RunRequest

    T = TypeVar("T")

START_TIMEOUT = 10.0
# The daemon's own environment: where things are, never the caller's secrets.
DAEMON_ENV = (
    "HOME",
    "USER",
    "LOGNAME",
    "PATH",
    "LANG",
    "LC_ALL",
    "XDG_RUNTIME_DIR",
    "XDG_STATE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "DBUS_SESSION_BUS_ADDRESS",
    "BOXY_UPSTREAM_DNS",
    "BOXY_UPSTREAM_CA",  # the CA --secret's upstream TLS trusts instead of the host's
    "BOXY_IDLE_EXIT",
)

# What the client tells the daemon about its environment. The first group may be
# passed on to the payload; the rest only feed the daemon's exposure check (which
# sockets must not be inside an exposed tree) and are never passed on.
CLIENT_ENV_NAMES = (
    "TERM",
    "LANG",
    "LANGUAGE",
    "TZ",
    "COLORTERM",
    "NO_COLOR",
    "HOME",
    "USER",
    # which registry a profile's {npm_registry}/{pip_index}… means: the
    # tools' own overrides, and the PATH that finds those tools
    "PATH",
    "npm_config_registry",
    "NPM_CONFIG_REGISTRY",
    "PIP_INDEX_URL",
    "GOPROXY",
    "GOSUMDB",
)
CLIENT_ENV_PREFIXES = ("LC_",)
EXPOSURE_ENV_NAMES = (
    "SSH_AUTH_SOCK",
    "GNUPGHOME",
    "DOCKER_HOST",
    "DBUS_SESSION_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
)


def client_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The subset of the client's environment sent with Run (see CLIENT_ENV_NAMES)."""
    return {
        k: v
        for k, v in environ.items()
        if k in CLIENT_ENV_NAMES or k in EXPOSURE_ENV_NAMES or k.startswith(CLIENT_ENV_PREFIXES)
    }


def _try_connect() -> Client | None:
    try:
        return Client.connect(socket_path_str())
    except DaemonUnavailable as e:
        if e.errno in (errno.ENOENT, errno.ECONNREFUSED):
            return None
        raise


def connect(*, start: bool = True) -> Client:
    """Connect to boxyd, starting it (under a lock, detached, as us) when nothing listens.
    Fds 0-2 are made open first: the connection must never take one (boxy/stdfds.py).
    Refused in one line (UsageError) inside a sandbox, where a boxyd started on demand
    could not run one, and under an XDG_RUNTIME_DIR that does not exist."""
    stdfds.ensure()
    if inside_sandbox():
        raise UsageError(
            "already inside a boxy sandbox: boxyctl talks to your boxyd from outside "
            "it (run it there)"
        )
    problem = runtime_base_problem()
    if problem is not None:
        raise UsageError(problem)
    ensure_private_dir(runtime_dir_str())
    client = _try_connect()
    if client is not None or not start:
        if client is None:
            raise DaemonError("boxyd is not running")
        return client
    lock = os.open(
        os.path.join(runtime_dir_str(), "start.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
    )
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        client = _try_connect()  # someone else may have started it while we waited
        if client is None:
            client = _start_daemon()
        return client
    finally:
        os.close(lock)


def _start_daemon() -> Client:
    log = os.path.join(ensure_private_dir(state_dir_str()), "boxyd.log")
    env = {k: os.environ[k] for k in DAEMON_ENV if k in os.environ}
    with open(log, "ab") as log_file:
        import subprocess  # only to start the daemon: not on every run's path

        proc = subprocess.Popen(
            [sys.executable, "-m", "boxyd"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            env=env,
            cwd="/",
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        client = _try_connect()
        if client is not None:
            return client
        if proc.poll() is not None:
            raise DaemonError(f"boxyd exited at start (status {proc.returncode}); see {log}")
        time.sleep(0.005)
    raise DaemonError(f"boxyd did not start within {START_TIMEOUT:g}s; see {log}")


class Controls:
    """Signal and Resize for a session this client follows, on a connection of their
    own: the one that streams Run or Attach carries no other call (boxyd ends it at
    the first: boxyd/api/varlink.py). Connected at the first use (most runs send
    none); safe from a signal handler on the thread that uses it, as
    Client.send_oneway is (a send that finds the connection being made is dropped)."""

    def __init__(self) -> None:
        self._client: Client | None = None
        self._connecting = False
        self._failed = False

    def send(self, method: str, parameters: dict[str, Any]) -> bool:
        """Send a oneway call; False when boxyd cannot be reached (the stream says how)."""
        if self._client is None:
            if self._failed or self._connecting:
                return False
            self._connecting = True
            try:
                self._client = connect(start=False)
            except (OSError, BoxyError):
                self._failed = True
                return False
            finally:
                self._connecting = False
        return self._client.send_oneway(method, parameters)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def wait_gone(timeout: float = 5.0) -> None:
    """After Shutdown: wait until the old daemon has let go of its lifetime lock."""
    deadline = time.monotonic() + timeout
    fd = os.open(
        os.path.join(runtime_dir_str(), "boxyd.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
    )
    try:
        while time.monotonic() < deadline:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                time.sleep(0.02)
    finally:
        os.close(fd)
    raise DaemonError("the old boxyd did not stop")


def add_secrets(request: RunRequest, e: SecretsNeeded, environ: Mapping[str, str]) -> None:
    """Answer SecretsNeeded from ENVIRON: env_secrets as secrets (never in
    client_env), env_pass values into client_env, the unset ones named as unset."""
    from boxy.request import Secret

    for name in e.passed:
        if name in environ:
            request.client_env[name] = environ[name]
        elif name not in request.env_unset:
            request.env_unset.append(name)
    have = {s.name for s in request.options.secret}
    for name in e.names:
        if name in have:
            continue
        if name not in environ:
            raise UsageError(
                f"profile {e.profile}: env_secrets {name}: not set in your "
                "environment (the profile passes it into the sandbox as a secret)"
            )
        request.options.secret.append(Secret(name, environ[name]))


def with_retries(
    request: RunRequest,
    once: Callable[[Client, RunRequest], T],
    *,
    environ: Mapping[str, str],
    say: Callable[[str], None] = lambda line: None,
    keep: bool = False,
) -> T:
    """ONCE(client, REQUEST) on a fresh connection, again when the first answer asks
    for the profile's secrets (from ENVIRON) or comes from an idle daemon of another
    build (shut down first; SAY tells the user). The connection is closed after,
    unless KEEP: then what ONCE returned owns it (a session followed on)."""
    for attempt in (1, 2, 3):
        client = connect()
        done = False
        try:
            result = once(client, request)
            done = True
            return result
        except SecretsNeeded as e:  # the profile's env_secrets: ours to send, by name
            if attempt == 3 or not (e.names or e.passed):
                raise
            add_secrets(request, e, environ)
        except BuildMismatch as e:
            if attempt == 2:
                raise
            try:
                client.call(f"{INTERFACE}.Shutdown", {})
            except Busy:
                raise DaemonError(
                    f"boxyd is running another build ({e.daemon_build}) and has sessions; "
                    "run `boxyctl daemon restart` when they finish"
                ) from None
            say("replaced an idle boxyd of another build")
            wait_gone()
        finally:
            if not (keep and done):
                client.close()
    raise AssertionError("unreachable: the third attempt returns or raises")


def read_reply(params: dict[str, Any]) -> RunReply:
    """A Run or Attach reply as its type (boxy.outcome's RunReply union); one boxyd
    sent that cannot be read is a DaemonError, never a KeyError."""
    from boxy.outcome import run_reply

    try:
        return run_reply(params)
    except ValueError as e:
        raise DaemonError(f"boxyd sent a reply this client cannot read: {e}") from None
