"""A real Claude Code against the fake Messages API (tests/harness/fakeanthropic.py), as
the unprivileged test user, in a user+network+pid namespace of its own: the only
interface is `lo`, nothing is routed, and every process of the run dies with it.

The package is pinned and installed once, by root, into a world-readable cache (the
npm registry is reached there and nowhere else):

    python3 tests/harness/claudecode.py install     # `make setup`; as root
    python3 tests/harness/claudecode.py check       # is it there, and does it start

`--ignore-scripts`: the native binary is taken from its platform package directly, so
the wrapper's postinstall (which only copies it over bin/claude.exe) need not run as
root. The wrapper wants node >= 22; the native binary needs no node at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.conftest import User

VERSION = "2.1.328"
PACKAGE = "@anthropic-ai/claude-code"
CACHE = Path("/var/cache/boxy-test/claude-code") / VERSION
HERE = Path(__file__).resolve().parent
FAKE_API = HERE / "fakeanthropic.py"
HOST_PY = "/usr/bin/python3"  # the test user cannot execute a venv's python under /root
FAKE_KEY = "sk-ant-api03-boxy-test-fake-key-000000000000000000000000"
INSTALL_TIMEOUT = 600

# What Claude Code needs to stay on the fake API: no updater, no telemetry, no error
# reports, no side calls (with NONESSENTIAL_TRAFFIC it makes one POST /v1/messages per
# turn and nothing else; without it, also HEAD /api/hello and DNS look-ups elsewhere).
ENV = {
    "ANTHROPIC_API_KEY": FAKE_KEY,
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}

# What a run leaves in the home (other tests want the home without them: the claude
# profile's stand-in refuses a ~/.claude it did not plant).
HOME_STATE = (".claude", ".claude.json", ".cache/claude-cli-nodejs")


def _platform() -> str:
    arch = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine())
    if arch is None:
        raise RuntimeError(f"no Claude Code build for {platform.machine()}")
    return f"linux-{arch}"


def binary(cache: Path = CACHE) -> Path:
    """Where the native binary sits in CACHE (whether or not it is there)."""
    return cache / "node_modules" / f"{PACKAGE}-{_platform()}" / "claude"


def installed(cache: Path = CACHE) -> Path | None:
    """The native binary when CACHE holds VERSION, else None."""
    bin_ = binary(cache)
    try:
        meta = json.loads((bin_.parent / "package.json").read_text())
    except (OSError, ValueError):
        return None
    if meta.get("version") != VERSION or not os.access(bin_, os.X_OK):
        return None
    return bin_


def _version_offline(bin_: Path) -> str:
    """`claude --version` in a netns of its own: even this start reaches nothing."""
    pre = ["unshare", "--net"] if os.getuid() == 0 else ["unshare", "-rn"]
    r = subprocess.run(
        [*pre, "--", str(bin_), "--version"],
        capture_output=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", **ENV},
    )
    if r.returncode != 0:
        raise RuntimeError(f"{bin_} --version: exit {r.returncode}: {r.stderr.decode()[-500:]}")
    return r.stdout.decode().strip()


def install(cache: Path = CACHE) -> Path:
    """VERSION in CACHE (as root; npm reads its own registry configuration). An install
    goes to a sibling directory first, renamed into place once whole and checked."""
    if found := installed(cache):
        return found
    if os.getuid() != 0:
        raise RuntimeError(
            f"{PACKAGE}@{VERSION} is not in {cache}: install it as root "
            f"(sudo {HOST_PY} {Path(__file__).resolve()} install)"
        )
    for d in [d for d in reversed(cache.parents) if not d.exists()]:
        d.mkdir()
        d.chmod(0o755)  # the test user walks down to the binary (umask aside)
    tmp = Path(tempfile.mkdtemp(prefix=f".{VERSION}-", dir=cache.parent))
    try:
        argv = ["npm", "install", "--prefix", str(tmp), "--ignore-scripts", "--no-audit"]
        argv += ["--no-fund", "--no-update-notifier", f"{PACKAGE}@{VERSION}"]
        r = subprocess.run(argv, capture_output=True, timeout=INSTALL_TIMEOUT)
        if r.returncode != 0:
            raise RuntimeError(f"npm install: exit {r.returncode}: {r.stderr.decode()[-2000:]}")
        subprocess.run(["chmod", "-R", "a+rX", str(tmp)], check=True, timeout=60)
        got = installed(tmp)
        if got is None:
            raise RuntimeError(f"npm installed no {binary(tmp)} of version {VERSION}")
        if VERSION not in (v := _version_offline(got)):
            raise RuntimeError(f"{got} --version says {v!r}, not {VERSION}")
        tmp.rename(cache)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    found = installed(cache)
    assert found is not None
    return found


# --- a run -------------------------------------------------------------------------------


class ClaudeRun(subprocess.CompletedProcess[bytes]):
    """The run's exit status and output, what the fake API was asked, and how long it took."""

    def __init__(
        self,
        proc: subprocess.CompletedProcess[bytes],
        requests: list[dict[str, Any]],
        seconds: float,
    ) -> None:
        super().__init__(proc.args, proc.returncode, proc.stdout, proc.stderr)
        self.requests = requests
        self.seconds = seconds

    def describe(self) -> str:
        paths = [f"{r['method']} {r['path']}" for r in self.requests]
        return (
            f"exit {self.returncode} in {self.seconds:.1f}s; requests {paths}\n"
            f"--- stdout\n{self.stdout.decode(errors='replace')}"
            f"--- stderr\n{self.stderr.decode(errors='replace')}"
        )

    def tool_results(self) -> list[str]:
        return [t for r in self.requests for t in r.get("tool_results", [])]


@contextlib.contextmanager
def _home_kept(home: Path) -> Iterator[None]:
    """Whatever of HOME_STATE the run created goes again afterwards."""
    absent = [home / p for p in HOME_STATE if not (home / p).exists()]
    cache_absent = not (home / ".cache").exists()
    try:
        yield
    finally:
        for p in absent:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        if cache_absent:
            with contextlib.suppress(OSError):
                (home / ".cache").rmdir()  # only if empty: never another tool's cache


def _managed_wrapper(tmp: Path, managed: dict[str, Any]) -> list[str]:
    """As root: a mount namespace whose /etc has claude-code/managed-settings.json (an
    overlay: the machine's /etc is not touched), for the policy scope of settings."""
    upper, work = tmp / "etc-upper", tmp / "etc-work"
    (upper / "claude-code").mkdir(parents=True)
    work.mkdir()
    (upper / "claude-code" / "managed-settings.json").write_text(json.dumps(managed))
    for p in (upper, upper / "claude-code", upper / "claude-code" / "managed-settings.json"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    opts = f"lowerdir=/etc,upperdir={upper},workdir={work}"
    script = f'mount -t overlay boxy-claude-etc -o {opts} /etc && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"]


def run_claude(
    user: User,
    project_dir: Path,
    prompt: str,
    *,
    tool_command: str | None = None,
    text: str = "FAKE-REPLY-DONE",
    args: Sequence[str] = (),
    extra_env: dict[str, str] | None = None,
    managed_settings: dict[str, Any] | None = None,
    timeout: float = 60,
    claude: Path | None = None,
) -> ClaudeRun:
    """`claude -p PROMPT ARGS` as USER in PROJECT_DIR, against the fake API. With
    TOOL_COMMAND the first reply is a Bash tool_use of it, then TEXT; else just TEXT.
    MANAGED_SETTINGS (root only) are put in /etc/claude-code for this run alone."""
    claude = claude or installed()
    if claude is None:
        raise RuntimeError(f"{PACKAGE}@{VERSION} is not installed in {CACHE}")
    tmp = Path(tempfile.mkdtemp(prefix="boxy-claude-"))
    try:
        script, log = tmp / "script.json", tmp / "requests.jsonl"
        script.write_text(json.dumps({"tool_command": tool_command, "text": text}))
        log.touch()
        if os.getuid() == 0:
            for p in (tmp, script, log):
                os.chown(p, user.uid, user.gid)
        # --keep-caps: the runner needs CAP_NET_ADMIN over its netns for `lo`, and drops
        # it before starting claude. --pid --fork --kill-child: nothing outlives the run;
        # --mount-proc: the pids Claude Code looks up in /proc are its own namespace's.
        ns = ["unshare", "--user", "--map-current-user", "--keep-caps", "--net"]
        ns += ["--pid", "--fork", "--kill-child", "--mount-proc", "--"]
        runner = [HOST_PY, "-I", str(FAKE_API), "run", "--script", str(script), "--log", str(log)]
        runner += ["--timeout", str(timeout), "--", str(claude), "-p", prompt, *args]
        argv = user.cmd([*ns, *runner], {**ENV, **(extra_env or {})})
        if managed_settings is not None:
            if os.getuid() != 0:
                raise RuntimeError("managed settings need root (a mount namespace over /etc)")
            argv = [*_managed_wrapper(tmp, managed_settings), *argv]
        start = time.monotonic()
        with _home_kept(user.home):
            proc = _bounded(argv, project_dir, timeout + 15)
        seconds = time.monotonic() - start
        requests = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        return ClaudeRun(proc, requests, seconds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _bounded(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[bytes]:
    """ARGV in a session of its own, killed whole (by its process group) at TIMEOUT."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        err += f"\nclaudecode: killed after {timeout}s".encode()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def main(argv: list[str]) -> int:
    if argv[1:] == ["install"]:
        try:
            bin_ = install()
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            print(f"claude-code: {e}", file=sys.stderr)
            return 1
        print(f"claude-code {VERSION}: {bin_}")
        return 0
    if argv[1:] == ["check"]:
        found = installed()
        if found is None:
            print(f"claude-code: {PACKAGE}@{VERSION} is not in {CACHE}", file=sys.stderr)
            return 1
        print(f"{found}: {_version_offline(found)}")
        return 0
    print(f"usage: {argv[0]} install|check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
