"""`boxyctl hook claude` (Claude Code's PreToolUse hook for Bash) and `boxyctl hook
install claude`: the I/O around boxyctl.hookpolicy. The configuration is the user's
own file, $XDG_CONFIG_HOME/boxy/hook.yaml, never the project's: the agent can write
the project (README, "Agents (Claude Code)")."""

from __future__ import annotations

import os
import pwd
import stat
import sys
import time

from boxy import INTERFACE, notices, wirejson
from boxy.errors import BoxyError, UsageError
from boxy.pathcheck import directory_problem, shown
from boxy.paths import config_home, ensure_private_dir, runtime_dir_str
from boxyctl import hookpolicy as hp
from boxyctl import shellquote
from boxyctl.fullsite import ensure_site

TYPE_CHECKING = False  # typing and pathlib cost the hook 10 ms; annotations only
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

MAX_INPUT = 1 << 20  # a command line is bounded by the harness; this bounds us
CONFIG_KEYS = (
    "intercept",
    "intercept_also",
    "passthrough",
    "profiles",
    "flags",
    "shell",
    "on_unavailable",
    "boxyctl",
)


def config_path() -> str:
    return os.path.join(config_home(os.environ.get("HOME")), "boxy", "hook.yaml")


def load_config(path: str | os.PathLike[str] | None = None) -> tuple[hp.HookConfig, str | None]:
    """hook.yaml (absent: the defaults) and its `boxyctl` path. A file that does not
    load is a UsageError: a hook that guessed would sandbox less than asked."""
    name = os.fspath(path) if path is not None else config_path()
    try:
        with open(name) as f:
            key = _cache_key(name, os.fstat(f.fileno()))
            doc = _cached(key)
            text = f.read() if doc is _MISSING else ""
    except FileNotFoundError:
        return hp.HookConfig(), None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{name}: {e}") from None
    if doc is _MISSING:
        doc = _parse(name, text)
        config = config_from(doc, name)
        _store(key, doc)
        return config
    return config_from(doc, name)


def _parse(name: str, text: str) -> object:
    ensure_site()  # started without it (boxyctl/launcher.py): PyYAML is no stdlib
    import yaml  # only when there is a file: the hook runs before every command

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UsageError(f"{name}: not valid YAML ({str(e).splitlines()[0]})") from None
    return doc if doc is not None else {}


# hook.yaml as parsed, kept beside the daemon's socket: loading PyYAML costs the hook,
# which runs before every command the agent types, more than the rest of it. Used only
# for the very file it was parsed from (device, inode, size, modification and change
# times), and written only for a file unchanged for SETTLED seconds: a change within
# the same tick of the kernel's clock keeps its times, but not past that.
CACHE_NAME = "hook-config.json"
SETTLED = 2.0
_MISSING = object()


def _cache_key(name: str, st: os.stat_result) -> list[object]:
    return [name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _cached(key: list[object]) -> object:
    """The document parsed from the file KEY names, if that is what the cache holds:
    read only from our own private directory (as connect() checks it: /tmp/boxy-UID
    could be another user's), from a regular file of ours, never through a symlink."""
    try:
        directory = ensure_private_dir(runtime_dir_str())
        fd = os.open(
            os.path.join(directory, CACHE_NAME),
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
        )
    except (OSError, BoxyError):
        return _MISSING
    try:
        with os.fdopen(fd) as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode):
                return _MISSING
            got = wirejson.loads(f.read())
    except (OSError, ValueError):
        return _MISSING
    if not isinstance(got, dict) or got.get("key") != key or "doc" not in got:
        return _MISSING
    return got["doc"]


def _store(key: list[object], doc: object) -> None:
    """Keep DOC for the file KEY names (best effort: without it the hook parses)."""
    ctime_ns = key[-1]
    if not isinstance(ctime_ns, int) or time.time() - ctime_ns / 1e9 < SETTLED:
        return
    try:
        data = wirejson.dumps({"key": key, "doc": doc})
    except (TypeError, ValueError):  # YAML has more types than JSON: parsed each time
        return
    try:
        directory = ensure_private_dir(runtime_dir_str())
        tmp = os.path.join(directory, f".{CACHE_NAME}.{os.getpid()}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(data)
        os.replace(tmp, os.path.join(directory, CACHE_NAME))
    except (OSError, BoxyError):
        pass


def _strings(doc: dict[str, Any], key: str, where: str) -> tuple[str, ...] | None:
    got = doc.get(key)
    if got is None:
        return None
    if not isinstance(got, list) or not all(isinstance(x, str) and x for x in got):
        raise UsageError(f"{where}: {key} must be a list of names")
    return tuple(got)


def config_from(doc: object, where: str) -> tuple[hp.HookConfig, str | None]:
    """A HookConfig from hook.yaml's mapping (WHERE names it in an error)."""
    if not isinstance(doc, dict):
        raise UsageError(f"{where}: not a mapping")
    unknown = sorted(set(map(str, doc)) - set(CONFIG_KEYS))
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(CONFIG_KEYS)})")
    base = hp.HookConfig()
    intercept = _strings(doc, "intercept", where) or base.intercept
    intercept += _strings(doc, "intercept_also", where) or ()
    profiles = doc.get("profiles") or {}
    if not isinstance(profiles, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in profiles.items()
    ):
        raise UsageError(f"{where}: profiles must map a program to a profile name")
    on_unavailable = doc.get("on_unavailable", base.on_unavailable)
    if on_unavailable not in hp.ON_UNAVAILABLE:
        raise UsageError(f"{where}: on_unavailable must be one of {', '.join(hp.ON_UNAVAILABLE)}")
    for key in ("shell", "boxyctl"):
        if key in doc and not (isinstance(doc[key], str) and doc[key]):
            raise UsageError(f"{where}: {key} must be a string")
    config = hp.HookConfig(
        intercept=intercept,
        passthrough=_strings(doc, "passthrough", where) or (),
        profiles={**base.profiles, **profiles},
        flags=_strings(doc, "flags", where) or (),
        shell=doc.get("shell", base.shell),
        on_unavailable=on_unavailable,
    )
    return config, doc.get("boxyctl")


def boxyctl_path(configured: str | None) -> str:
    """The boxyctl the rewritten command runs: the configured one, else the one
    beside this program (the agent's shell may have another PATH), else PATH's."""
    if configured:
        return configured
    here = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0] or "boxyctl")), "boxyctl")
    if os.access(here, os.X_OK):
        return here
    import shutil  # seldom: boxyctl is beside this program

    return shutil.which("boxyctl") or "boxyctl"


def approved_profile(workdir: str) -> str | None:
    """The profile WORKDIR's .boxy.yaml names when `boxyctl trust` approved it as it is
    now, as boxyd reads it for a run (Trusted). Only asked when there is one; None when
    boxyd cannot say (the run then says why)."""
    from boxy.paths import PROJECT_CONFIG

    if not os.path.lexists(os.path.join(workdir, PROJECT_CONFIG)):
        return None
    from boxy.client import client_env
    from boxyctl.connect import connect

    try:
        client = connect()
        try:
            got = client.call(
                f"{INTERFACE}.Trusted", {"cwd": workdir, "client_env": client_env(os.environ)}
            )
        finally:
            client.close()
    except (BoxyError, OSError):
        return None
    profile = got.get("profile")
    return profile if got.get("trusted") is True and isinstance(profile, str) else None


def daemon_problem() -> str | None:
    """Why boxyd cannot be reached (started on demand, as a run would), or None."""
    from boxyctl.connect import connect

    try:
        connect().close()
    except (BoxyError, OSError) as e:
        return str(e) or type(e).__name__
    return None


def _emit(answer: dict[str, object]) -> int:
    sys.stdout.write(wirejson.dumps(answer) + "\n")
    return 0


def claude(data: bytes) -> int:
    """The PreToolUse hook: an intercepted Bash command comes back rewritten and
    allowed; any other gets no answer (the harness asks as usual); boxyd out of
    reach denies it (or, configured so, no answer). Bad input: exit 2, one line."""
    try:
        event = hp.parse_event(data)
    except ValueError as e:
        raise UsageError(f"hook claude: {e}") from None
    if event is None:
        return 0
    from boxy.paths import inside_sandbox

    if inside_sandbox():  # the command runs in this sandbox already: the harness asks
        return 0
    # fail closed: a cwd that is not there is no project the hook can judge (its
    # approval, its profile), and the rewritten command would not run there either
    problem = directory_problem(event.cwd)
    if problem is not None:
        raise UsageError(
            f"hook claude: the event's cwd {shown(event.cwd)}: {problem}; the command was blocked"
        )
    widening = hp.widens(event.command)
    if widening is not None:  # `boxyctl allow` / `trust`: the user's to answer
        return _emit(hp.ask_to_widen(widening))
    config, configured = load_config()
    if hp.decide(event.command, config) is None:  # not intercepted: nothing to ask boxyd
        lines = notices.take()  # what the user must see goes to the user's prompt
        return _emit(hp.told(None, lines)) if lines else 0
    try:
        decision, problem = _ask_boxyd(event, config)
    except _TooSlow:  # the harness's own timeout would let the command run unsandboxed
        decision, problem = None, f"no answer within {ASK_DEADLINE:g}s"
    if decision is None or problem is not None:
        if config.on_unavailable == "ask":
            return 0
        return _emit(
            hp.deny(
                f"boxy: boxyd cannot be reached ({problem}), so this command would run "
                "unsandboxed; start it (`boxyctl setup`, `boxyctl doctor`) and try again"
            )
        )
    command = hp.wrap(event.command, decision, config, boxyctl_path(configured))
    answer = hp.allow(event, command, hp.reason(decision))
    lines = notices.take()
    return _emit(hp.told(answer, lines) if lines else answer)


ASK_DEADLINE = 20.0  # seconds for boxyd's answers, under the harness's 30 (HOOK_TIMEOUT)


class _TooSlow(Exception):
    pass


def _ask_boxyd(event: hp.Event, config: hp.HookConfig) -> tuple[hp.Decision | None, str | None]:
    """The decision with the project's approval, and why boxyd cannot be reached (or
    None), within ASK_DEADLINE: a boxyd held up (a hostile project stalling it, a
    queue of questions) must not run out the harness's timeout, after which Claude
    Code runs the command as if the hook had said nothing (attack finding F1b)."""
    from boxyctl import sig

    def too_slow(_signum: int, _frame: object) -> None:
        raise _TooSlow

    old = sig.signal(sig.SIGALRM, too_slow)
    sig.setitimer(sig.ITIMER_REAL, ASK_DEADLINE)
    try:
        decision = hp.decide(event.command, config, approved=approved_profile(event.cwd))
        return decision, daemon_problem()
    finally:
        sig.setitimer(sig.ITIMER_REAL, 0)
        sig.signal(sig.SIGALRM, old)  # type: ignore[arg-type]  # what signal() returned


def read_stdin() -> bytes:
    data = sys.stdin.buffer.read(MAX_INPUT + 1)
    if len(data) > MAX_INPUT:
        raise UsageError(f"hook claude: the input is larger than {MAX_INPUT >> 10} KiB")
    return data


def settings_path(project: bool, cwd: str) -> Path:
    from pathlib import Path

    if project:
        if not cwd:
            raise UsageError("hook install: the current directory was removed")
        return Path(cwd) / ".claude" / "settings.json"
    return (
        Path(os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir)
        / ".claude"
        / ("settings.json")
    )


def install(path: Path, command: str, *, remove: bool) -> str:
    """Our entry into (or out of) Claude Code's settings file PATH, every other key
    kept; written atomically, or not at all. Returns what was done, for a line."""
    from pathlib import Path

    path = Path(os.path.realpath(path))  # a dotfile manager's symlink stays one
    try:
        text: str | None = path.read_text()
    except FileNotFoundError:
        text = None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: {e}") from None
    try:
        settings = wirejson.loads(text) if text is not None and text.strip() else {}
        if not isinstance(settings, dict):
            raise ValueError("not a JSON object")
        new = hp.without_hook(settings) if remove else hp.with_hook(settings, command)
    except ValueError as e:
        raise UsageError(f"{path}: not valid settings ({e}); left unchanged") from None
    verb = "removed from" if remove else "installed in"
    if new == settings and text is not None:
        return f"{'not in' if remove else 'already in'} {path}; unchanged"
    if remove and text is None:
        return f"not in {path}; unchanged"
    import json  # (indented, for the user to read: installing is seldom)

    _write_atomic(path, json.dumps(new, indent=2) + "\n")
    return f"{verb} {path}"


def _write_atomic(path: Path, text: str) -> None:
    """A temporary file beside PATH, synced, then renamed over it (its mode kept)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o600
    tmp = path.with_name(f".{path.name}.boxy-{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _on_terminal() -> bool:
    try:
        return os.isatty(0)
    except (OSError, ValueError):
        return False


def _claude_closed(say: Any) -> int:
    """The hook, failing closed: Claude Code runs the command unchanged after any exit
    but 2, so a bug here (any exception) blocks it, in one line the agent is shown."""
    try:
        if _on_terminal():
            raise UsageError(
                "hook claude: reads Claude Code's PreToolUse event (JSON) on stdin, and "
                "stdin is a terminal; `boxyctl hook install claude` adds the hook to "
                "Claude Code's settings"
            )
        return claude(read_stdin())
    except UsageError:
        raise
    except Exception as e:
        if os.environ.get("BOXY_DEBUG"):
            raise
        say(f"hook claude: internal error: {type(e).__name__}: {e}; the command was blocked")
        return 2


def main(argv: list[str], cwd: str, say: Any) -> int:
    """`hook …` (ARGV after `hook`): the fast path for `hook claude`, which runs
    before every command the agent types; argparse for the rest."""
    if argv == ["claude"]:
        return _claude_closed(say)
    from boxyctl import parser as p

    try:
        ns = p.build_parser("boxyctl").parse_args(["hook", *argv])
    except p.Help as h:
        sys.stdout.write(h.text)
        return 0
    if ns.action is None:
        raise UsageError("hook: missing action (claude, install claude [--project] [--remove])")
    if ns.action == "claude":
        return _claude_closed(say)
    say(install(settings_path(ns.project, cwd), install_command(ns.project), remove=ns.remove))
    return 0


# A project's settings are usually committed: the command there names boxyctl as every
# clone's PATH finds it, never this machine's path to it (issue 33 §2).
PORTABLE = "boxyctl hook claude"


def install_command(project: bool) -> str:
    """The hook's command for the settings file: your own (~/.claude) names this
    boxyctl (the configured one, or the one running), a project's the PORTABLE one."""
    if project:
        return PORTABLE
    _, configured = load_config()
    return f"{shellquote.quote(boxyctl_path(configured))} hook claude"
