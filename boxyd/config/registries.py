"""Where the user's package tools fetch from, asked of the tools themselves.

Profiles name registries by template ({npm_registry}, {pip_index}, {pip_files},
{go_proxy}, {go_sumdb}) and never by host: a private mirror configured in
~/.npmrc or pip.conf just works, and boxy holds no opinion on which public registry
is the right one. The tool is found only outside every payload-writable tree (a
venv's bin/npm on the client's PATH is the payload's) and runs in a tool sandbox
(boxyd/plan/tools.py) that sees its installation and its config files, nothing else,
with a bounded time; an environment override the client sent
(npm_config_registry, PIP_INDEX_URL …) wins, as it would for the tool itself. Answers are cached briefly: asking npm costs
a node start-up and asking pip a python one, so each is asked once for everything (one
start-up, not one per setting) and its answer is kept until one of the config files it
read (npm's npmrc files, pip's pip.conf files) changes, an hour at most.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import urlsplit

from boxyd.config.hosttools import (
    Box,
    Exposure,
    Opener,
    ToolError,
    installation,
    resolve,
    safe_path,
)

TIMEOUT = 10.0
ANSWER_MAX = 64 << 10
# What the tools read their settings from, relative to $HOME unless absolute: all
# that a tool sandbox shows of the user's files (npm's globalconfig lies in its prefix)
CONFIG_FILES = (
    ".npmrc",
    ".config/pip/pip.conf",
    ".pip/pip.conf",
    "/etc/pip.conf",
    "/etc/xdg/pip/pip.conf",
    ".config/go/env",
)
CACHE_SECONDS = 60.0
# npm's and pip's answers name the config files they read (npm: userconfig,
# globalconfig): kept while those are unchanged, re-asked at once when one is edited,
# created or removed
FILES_CACHE_SECONDS = 3600.0
# One `npm config get` for every npm template: each question costs a node start-up.
NPM_KEYS = ("registry", "cafile", "userconfig", "globalconfig")

# The override each template honours, in the tool's own precedence.
ENV_OVERRIDES: dict[str, tuple[str, ...]] = {
    "npm_registry": ("npm_config_registry", "NPM_CONFIG_REGISTRY"),
    "npm_registry_url": ("npm_config_registry", "NPM_CONFIG_REGISTRY"),
    "npm_cafile": ("npm_config_cafile", "NPM_CONFIG_CAFILE"),
    "pip_index": ("PIP_INDEX_URL",),
    "pip_index_url": ("PIP_INDEX_URL",),
    "pip_cert": ("PIP_CERT",),
    "go_proxy": ("GOPROXY",),
    "go_sumdb": ("GOSUMDB",),
}

# One python start-up for every pip template, asked of pip's own code: its default index
# (pip's, not a guess of ours), the two settings `pip config get` would give, and the
# config files pip reads (the answer is kept while they are as they were).
_PIP_SETTINGS = (
    "from pip._internal.models.index import PyPI\n"
    "print('index=' + PyPI.url)\nprint('files=' + PyPI.file_storage_domain)\n"
    "from pip._internal import configuration as c\n"
    "conf = c.Configuration(isolated=False)\nconf.load()\n"
    "for key in ('global.index-url', 'global.cert'):\n"
    "    try:\n        print(key + '=' + conf.get_value(key))\n"
    "    except c.ConfigurationError:\n        pass\n"
    "for files in c.get_configuration_files().values():\n"
    "    print(*('file=' + f for f in files), sep='\\n')\n"
)


def host_of(value: str) -> str | None:
    """The host name in a registry setting: a URL (https://h:8443/path), or the first
    entry of a GOPROXY-style list; None for off/direct or anything without a host."""
    value = value.strip().split(",")[0].split("|")[0].strip()
    if not value or value in ("off", "direct"):
        return None
    if "://" not in value:
        value = "https://" + value  # GOSUMDB and bare GOPROXY entries name just a host
    try:
        host = urlsplit(value).hostname
    except ValueError:
        return None
    return host or None


_Stats = tuple[tuple[int, int, int] | None, ...]  # per file: (inode, mtime, size), or absent
_Files = tuple[tuple[str, ...], _Stats]  # the npmrc files an answer came from, as they were
# (binary, its arguments, its environment) -> (when, the answer, its files)
_TOOL_CACHE: dict[
    tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]],
    tuple[float, str | None, _Files | None],
] = {}
_TOOL_LOCK = threading.Lock()


def _settings(out: str | None) -> dict[str, str]:
    """`npm config get K1 K2 …` prints one `key=value` line per key."""
    pairs = (line.partition("=") for line in (out or "").splitlines())
    return {k.strip(): v.strip() for k, sep, v in pairs if sep}


def _config_files(answer: str | None) -> tuple[str, ...]:
    """The config files an answer came from: npm's npmrc files, pip's `file=` lines
    (none for the other tools)."""
    found = _settings(answer)
    npmrc = (found.get(k, "") for k in ("userconfig", "globalconfig"))
    pip = (line[5:] for line in (answer or "").splitlines() if line.startswith("file="))
    return tuple(f for f in (*npmrc, *pip) if f.startswith("/"))


def _stat_all(paths: tuple[str, ...]) -> _Stats:
    def one(path: str) -> tuple[int, int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    return tuple(one(p) for p in paths)


class Registries:
    """A resolver for profiles.resolve_hosts and resolve_env: template name → host
    (or URL, or file), or None."""

    def __init__(
        self,
        env: Mapping[str, str],
        run: Callable[[list[str]], str | None] | None = None,
        *,
        tools: Opener | None = None,
        writable: Sequence[str] = (),
    ) -> None:
        """RUN answers a tool's argv (tests); otherwise the tool runs in a sandbox TOOLS
        opens (none: no tool is asked at all). WRITABLE: every tree the payload of this
        or a live session could write; no tool is taken from one."""
        self._env = dict(env)
        self._run = run or self._run_tool
        self._tools = tools
        self._writable = tuple(writable)
        self._boxes: dict[str, Box] = {}
        self.notes: list[str] = []  # which binary answered (-v)
        self._cache: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str) -> str | None:
        for var in ENV_OVERRIDES.get(name, ()):
            if self._env.get(var):
                return self._shape(name, self._env[var])
        with self._lock:
            hit = self._cache.get(name)
            if hit is not None and time.monotonic() - hit[0] < CACHE_SECONDS:
                return hit[1]
        value = self._ask(name)
        with self._lock:
            self._cache[name] = (time.monotonic(), value)
        return value

    @staticmethod
    def _shape(name: str, value: str) -> str | None:
        """A host for host templates; a credential-free URL or an existing file for
        the env templates (a URL with a token in it is never handed to the sandbox)."""
        if name.endswith("_url"):
            try:
                parts = urlsplit(value.strip())
            except ValueError:
                return None
            if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
                return None
            return value.strip()
        if name in ("npm_cafile", "pip_cert"):
            return value if value.startswith("/") and os.path.isfile(value) else None
        return host_of(value)

    def _ask(self, name: str) -> str | None:
        if name in ("npm_registry", "npm_registry_url", "npm_cafile"):
            key = "cafile" if name == "npm_cafile" else "registry"
            out = _settings(self._run(["npm", "config", "get", *NPM_KEYS])).get(key)
            return self._shape(name, out) if out and out != "null" else None
        if name in ("pip_index_url", "pip_cert", "pip_index", "pip_files"):
            return self._pip(name, _settings(self._run(["python3", "-c", _PIP_SETTINGS])))
        if name in ("go_proxy", "go_sumdb"):
            out = self._run(["go", "env", "GOPROXY" if name == "go_proxy" else "GOSUMDB"])
            return host_of(out) if out else None
        return None

    def _pip(self, name: str, found: dict[str, str]) -> str | None:
        configured = found.get("global.index-url")
        if name in ("pip_index_url", "pip_cert"):
            out = configured if name == "pip_index_url" else found.get("global.cert")
            return self._shape(name, out) if out else None
        default = found.get("index", "")
        if name == "pip_index":
            return host_of(configured or default)
        # Files come from the index's own host unless it is pip's default index.
        if configured and default and host_of(configured) != host_of(default):
            return host_of(configured)
        return host_of(found.get("files", ""))

    def _run_tool(self, argv: list[str]) -> str | None:
        """The tool's answer, cached across runs (a Registries lives for one run; a
        node start-up per question would cost every npm run a second)."""
        env = {k: v for k, v in self._env.items() if k in ("HOME", "PATH", "USER", "LANG")}
        env["PATH"] = safe_path(env.get("PATH", os.defpath), self._writable)
        env.setdefault("HOME", os.path.expanduser("~"))
        binary = resolve(argv[0], env["PATH"], self._writable)
        if binary is None:
            self._note(
                f"{argv[0]}: not found outside the writable trees; its settings were not asked"
            )
            return None
        key = (binary, tuple(argv[1:]), tuple(sorted(env.items())))
        with _TOOL_LOCK:
            hit = _TOOL_CACHE.get(key)
        if hit is not None:
            at, answer, files = hit
            ttl = FILES_CACHE_SECONDS if files else CACHE_SECONDS
            if time.monotonic() - at < ttl and (not files or _stat_all(files[0]) == files[1]):
                return answer
        answer = self._ask_tool(binary, argv[1:], env)
        named = _config_files(answer)
        files = (named, _stat_all(named)) if named else None
        with _TOOL_LOCK:
            if len(_TOOL_CACHE) > 256:
                _TOOL_CACHE.clear()
            _TOOL_CACHE[key] = (time.monotonic(), answer, files)
        return answer

    def _note(self, line: str) -> None:
        if line not in self.notes:
            self.notes.append(line)

    def _ask_tool(self, binary: str, args: list[str], env: dict[str, str]) -> str | None:
        """BINARY's answer from inside its own tool sandbox (one per binary and run)."""
        if self._tools is None:
            return None
        home = env["HOME"]
        try:
            box = self._boxes.get(binary)
            if box is None:
                files = tuple(
                    f if f.startswith("/") else os.path.join(home, f) for f in CONFIG_FILES
                )
                exposure = Exposure(
                    home=home, files=files, execute=installation(binary, home, self._writable)
                )
                box = self._boxes[binary] = self._tools(exposure)
            r = box.run([binary, *args], cwd=home, env=env, timeout=TIMEOUT, limit=ANSWER_MAX)
        except ToolError as e:
            self._note(f"{os.path.basename(binary)} settings: {binary} could not be asked ({e})")
            return None
        self._note(f"{os.path.basename(binary)} settings: asked {binary}, in a tool sandbox")
        out = r.out.decode(errors="replace").strip()
        return out if r.rc == 0 and out and out != "undefined" else None

    def close(self) -> None:
        """End the tool sandboxes this resolver opened."""
        for box in self._boxes.values():
            box.close()
        self._boxes.clear()
