"""Profiles: YAML presets and user files, validated strictly, templates expanded.

A profile is read once per run by the daemon, so every mistake in it must come
back as one line naming the file, the key and what was expected. Host templates
for registries ({npm_registry}, {pip_index} …) are kept as written here and
resolved later by ``resolve_hosts`` with a resolver the daemon supplies, because
the answer lives in the tool's own configuration, not in boxy.
"""

from __future__ import annotations

import copy
import importlib.resources
import os
import re
import stat
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from boxy import caches, options
from boxy.errors import ProfileError, UsageError
from boxy.paths import config_home
from boxy.values import (
    PUBLISH_FORM,
    PortMapping,
    parse_cidrs,
    parse_duration,
    parse_host_spec,
    parse_publish,
    parse_size,
)
from boxyd.config.envpolicy import check_name
from boxyd.config.runspec import CopyEntry, PathEntry

# {cache}: boxy's own package cache for this work directory and profile (caches.py)
PATH_TEMPLATES = ("workdir", "workdir_slug", "home", "cache")
# Filled from the tool's own configuration at run time (never a host name written here).
HOST_TEMPLATES = ("npm_registry", "pip_index", "pip_files", "go_proxy", "go_sumdb")
# The tool's own settings, for env values: the sandbox does not see ~/.npmrc or
# pip.conf (they hold tokens), so what the allowlist was built from is handed in.
ENV_TEMPLATES = ("npm_registry_url", "npm_cafile", "pip_index_url", "pip_cert")

NETS = options.choices("net")  # the profile keys take what the flags take
SECCOMP_MODES = options.choices("seccomp")
_TOP_KEYS = (
    "description",
    "extends",
    "net",
    "allow_hosts",
    "allow_ports",
    "allow_cidr",
    "tailscale",
    "ports",
    "filesystem",
    "env",
    "env_pass",
    "env_secrets",
    "limits",
    "seccomp",
    "tty",
    "tty_raw",
)
_FS_KEYS = ("ro", "rw", "mkdir", "protect", "reveal", "copy", "copy_ro", "tmpfs", "secrets")
_LIMIT_KEYS = ("memory", "pids", "cpus", "timeout")
_PRESET_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]*")
_TEMPLATE_RE = re.compile(r"\{([^{}]*)\}")
_MAX_FILE = 1 << 20  # a profile is a screenful; refuse reading a runaway file into memory


@dataclass
class Profile:
    name: str  # as given (preset name or path)
    source: str  # how messages name it: the preset name or the file path
    description: str = ""
    net: str | None = None
    allow_hosts: list[str] = field(default_factory=list)  # may hold HOST_TEMPLATES
    allow_ports: list[int] = field(default_factory=list)
    allow_cidrs: list[str] = field(default_factory=list)  # ranges whose denial is lifted
    ports: list[PortMapping] = field(default_factory=list)  # published (--publish)
    tailscale: bool | None = None
    ro: list[PathEntry] = field(default_factory=list)
    rw: list[PathEntry] = field(default_factory=list)
    mkdir: list[PathEntry] = field(default_factory=list)
    protect: list[PathEntry] = field(default_factory=list)
    reveal: list[PathEntry] = field(default_factory=list)  # credentials shown, not covered
    copy: list[CopyEntry] = field(default_factory=list)
    copy_ro: list[CopyEntry] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    env_pass: list[str] = field(default_factory=list)
    # passed from boxyctl's environment as --secret NAME is (never logged)
    env_secrets: list[str] = field(default_factory=list)
    tmpfs: list[str] = field(default_factory=list)  # absolute paths inside: a fresh tmpfs each
    # the user's own credential patterns (globs, relative to each writable tree): covered empty
    secrets: list[str] = field(default_factory=list)
    tty: bool | None = None
    tty_raw: bool | None = None  # the terminal output unfiltered (--tty-raw)
    memory: int | None = None
    pids: int | None = None
    cpus: float | None = None
    timeout: float | None = None
    seccomp: str | None = None


def workdir_slug(workdir: str) -> str:
    """The directory name Claude Code files a project's transcripts under.

    Claude Code replaces every character that is not an ASCII letter or digit with
    '-' (so '/home/u/p' → '-home-u-p'); doing the same also guarantees the slug can
    never hold a '/' or '..' that would climb out of ~/.claude/projects.
    """
    return re.sub(r"[^A-Za-z0-9]", "-", workdir)


def is_path(name_or_path: str) -> bool:
    return "/" in name_or_path or name_or_path.endswith((".yaml", ".yml"))


def _preset_dir() -> Any:
    return importlib.resources.files("boxyd") / "profiles"


def list_profiles() -> list[str]:
    """The preset names, sorted."""
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in _preset_dir().iterdir()
        if entry.name.endswith(".yaml")
    )


def user_dir(home: str | None = None) -> str:
    """$XDG_CONFIG_HOME/boxy/profiles (~/.config/boxy/profiles): the user's own."""
    return os.path.join(config_home(home), "boxy", "profiles")


def user_profiles(home: str | None = None) -> dict[str, str]:
    """NAME -> path of every user profile (NAME.yaml under user_dir)."""
    try:
        names = os.listdir(user_dir(home))
    except OSError:
        return {}
    return {
        n.removesuffix(".yaml"): os.path.join(user_dir(home), n)
        for n in sorted(names)
        if n.endswith(".yaml") and _PRESET_NAME_RE.fullmatch(n.removesuffix(".yaml"))
    }


def where(
    name_or_path: str, home: str | None = None, *, preset_only: bool = False
) -> tuple[str, str]:
    """(kind, location) a name is found at, in lookup order: a path; the user's
    profile NAME.yaml; the preset NAME (PRESET_ONLY: a user profile extending the
    preset it is named after)."""
    if is_path(name_or_path):
        return "file", name_or_path
    user = None if preset_only else user_profiles(home).get(name_or_path)
    if user is not None:
        return "user", user
    if _PRESET_NAME_RE.fullmatch(name_or_path) and name_or_path in list_profiles():
        return "preset", name_or_path
    raise ProfileError(
        f"unknown profile {name_or_path!r} (presets: {', '.join(list_profiles())}; your own "
        f"under {user_dir(home)}/NAME.yaml; or give a path to a .yaml file)"
    )


def _read_file(label: str, path: str) -> bytes:
    """A profile file: O_NONBLOCK|O_NOFOLLOW on the last component (a FIFO there must
    not hang the daemon's worker), a regular file, bounded."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise ProfileError(f"profile {label}: {(e.strerror or str(e)).lower()}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ProfileError(f"profile {label}: not a regular file")
        return os.read(fd, _MAX_FILE + 1)
    finally:
        os.close(fd)


def _read(
    name_or_path: str, home: str | None = None, *, preset_only: bool = False
) -> tuple[str, str]:
    """(label for messages, text) of a profile file, a user profile or a preset."""
    kind, location = where(name_or_path, home, preset_only=preset_only)
    label = name_or_path if kind != "user" else location
    if kind == "preset":
        data = (_preset_dir() / f"{name_or_path}.yaml").read_bytes()
    else:
        data = _read_file(label, location)
    if len(data) > _MAX_FILE:
        raise ProfileError(f"profile {label}: larger than {_MAX_FILE} bytes")
    try:
        return label, data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProfileError(f"profile {label}: not UTF-8 text (byte {e.start})") from None


# Nesting a real profile needs is 4 (filesystem → ro → entry → path); PyYAML's
# scanner is quadratic and its composer recursive in depth, so refuse far past that.
MAX_DEPTH = 32
# Values a user profile may expand to through aliases: a screenful is a few hundred.
MAX_NODES = 100_000


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a repeated key, nesting deeper than MAX_DEPTH, and a
    document larger than MAX_NODES values once its aliases are expanded. Every error
    comes out as a yaml.YAMLError with the line it was found at."""

    allow_aliases = True

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0  # values composed so far, an alias counting as all it stands for
        self._sizes: dict[str, int] = {}  # anchor -> values under it, once composed

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:  # noqa: N803 - PyYAML's name
        # checked here, not in the composer: the scanner reads all of '[[[[…' ahead
        if self.flow_level >= MAX_DEPTH:
            raise _error(f"nested deeper than {MAX_DEPTH} levels", self.get_mark())
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]  # untyped in PyYAML's stubs
        if isinstance(event, yaml.AliasEvent) or event.anchor is not None:
            if not self.allow_aliases:
                raise _error(
                    "anchors and aliases (&, *) are not allowed in a project file", event.start_mark
                )
            if isinstance(event, yaml.AliasEvent):
                return self._alias(event)
        if self._depth >= MAX_DEPTH:
            raise _error(f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        self._depth += 1
        before = self._nodes
        self._count(1, event.start_mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if event.anchor is not None:
            self._sizes[event.anchor] = self._nodes - before
        return node

    def _alias(self, event: yaml.AliasEvent) -> Any:
        if event.anchor in self.anchors and event.anchor not in self._sizes:
            raise _error(
                f"alias *{event.anchor} refers to a value that contains it", event.start_mark
            )
        self._count(self._sizes.get(event.anchor or "", 0), event.start_mark)
        # PyYAML's own undefined-alias check; an alias has no parent or index to resolve by
        return super().compose_node(None, None)  # type: ignore[arg-type]

    def _count(self, n: int, mark: Any) -> None:
        self._nodes += n
        if self._nodes > MAX_NODES:
            raise _error(f"more than {MAX_NODES} values once its aliases are expanded", mark)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (yaml.YAMLError, RecursionError):
            raise
        except Exception as e:  # noqa: BLE001 - PyYAML's constructors on hostile scalars
            # raise whatever they hit: ValueError (!!int y, 5,000 digits, a bad date),
            # AttributeError (!!timestamp x), binascii.Error (!!binary), TypeError …
            raise _error(
                f"cannot read {node.tag.rpartition(':')[2]} {_short(node)}: {e}", node.start_mark
            ) from None


class _ProjectLoader(_StrictLoader):
    """A project file: the payload may have written it, and an alias bomb of a few
    hundred bytes expands to gigabytes in whatever walks the result."""

    allow_aliases = False


def _error(problem: str, mark: Any) -> yaml.YAMLError:
    return yaml.constructor.ConstructorError(None, None, problem, mark)


def _short(node: yaml.Node) -> str:
    value = node.value if isinstance(node, yaml.ScalarNode) else ""
    return repr(value[:40] + ("…" if len(value) > 40 else ""))


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):
            raise _error("a key that is a list or mapping", key_node.start_mark)
        if key in seen:
            raise _error(f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


# Documents by the text they were parsed from: PyYAML's pure-Python loader costs a
# run ~10 ms per profile, and the same text (read anew each run) parses to the same
# document with the same loader. Errors are not kept; a copy goes out each time.
_PARSED: dict[tuple[type[_StrictLoader], str], dict[str, Any]] = {}
_PARSED_MAX = 64


def _parse_yaml(
    label: str, text: str, loader: type[_StrictLoader] = _StrictLoader
) -> dict[str, Any]:
    """TEXT as a mapping; anything wrong with it is one ProfileError naming LABEL."""
    key = (loader, text)
    hit = _PARSED.get(key)
    if hit is not None:
        return copy.deepcopy(hit)
    doc = _parse_text(label, text, loader)
    if len(_PARSED) >= _PARSED_MAX:
        _PARSED.clear()
    _PARSED[key] = copy.deepcopy(doc)
    return doc


def _parse_text(label: str, text: str, loader: type[_StrictLoader]) -> dict[str, Any]:
    try:
        doc = yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise ProfileError(f"profile {label}: invalid YAML{where}: {e.problem or e}") from None
    except yaml.YAMLError as e:  # the reader's: a character YAML does not allow
        raise ProfileError(f"profile {label}: invalid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:  # unreachable past MAX_DEPTH; kept so no file can crash a reader
        raise ProfileError(f"profile {label}: invalid YAML: nested too deeply") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ProfileError(f"profile {label}: expected a mapping of keys at the top level")
    return doc


class _Checker:
    """Validation of one profile document; every error names the file and key."""

    def __init__(self, label: str, context: Mapping[str, str]) -> None:
        self.label = label
        self.values = {
            "workdir": context["workdir"],
            "home": context["home"],
            "workdir_slug": context.get("workdir_slug") or workdir_slug(context["workdir"]),
            "cache": context.get("cache")
            or caches.project_dir(context["home"], label, context["workdir"]),
        }

    def fail(self, key: str, expected: str) -> ProfileError:
        return ProfileError(f"profile {self.label}: key {key}: {expected}")

    def keys(self, doc: Mapping[Any, Any], allowed: tuple[str, ...], prefix: str = "") -> None:
        for key in doc:
            if key not in allowed:
                raise ProfileError(
                    f"profile {self.label}: unknown key {prefix + str(key)!r} "
                    f"(expected one of: {', '.join(allowed)})"
                )

    def string(self, key: str, value: Any, expected: str = "expected a string") -> str:
        if not isinstance(value, str):
            raise self.fail(key, expected)
        return value

    def choice(self, key: str, value: Any, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise self.fail(key, f"expected one of: {', '.join(choices)}")
        return str(value)  # one of CHOICES: a str already

    def list_of(self, key: str, value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(key, "expected a list")
        return value

    def boolean(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, "expected true or false")
        return value

    def expand(self, key: str, raw: str) -> str:
        """Templates and ~ expanded; the result must be an absolute path."""

        def sub(m: re.Match[str]) -> str:
            if m.group(1) not in PATH_TEMPLATES:
                raise self.fail(
                    key,
                    f"unknown template {{{m.group(1)}}} "
                    f"(expected one of: {', '.join('{' + t + '}' for t in PATH_TEMPLATES)})",
                )
            return self.values[m.group(1)]

        path = _TEMPLATE_RE.sub(sub, raw)
        if path == "~" or path.startswith("~/"):
            path = self.values["home"] + path[1:]
        if not path.startswith("/") or "\0" in path:
            raise self.fail(
                key, f"{raw!r} is not an absolute path (start with /, ~ or {{workdir}})"
            )
        return os.path.normpath(path)

    def path_entry(self, key: str, value: Any) -> PathEntry:
        expected = "expected a path string or {path:, optional:}"
        if isinstance(value, str):
            return PathEntry(self.expand(key, value))
        if isinstance(value, dict) and "path" in value:
            self.keys(value, ("path", "optional"), f"{key}.")
            path = self.string(f"{key}.path", value["path"], expected)
            optional = self.boolean(f"{key}.optional", value.get("optional", False))
            return PathEntry(self.expand(f"{key}.path", path), optional)
        raise self.fail(key, expected)

    def copy_entry(self, key: str, value: Any) -> CopyEntry:
        expected = "expected 'SRC[:DST]' or {src:, dst:, optional:}"
        optional = False
        if isinstance(value, str):
            src, _, dst = value.partition(":")
            if not src or (":" in value and not dst):
                raise self.fail(key, expected)
        elif isinstance(value, dict) and "src" in value:
            self.keys(value, ("src", "dst", "optional"), f"{key}.")
            src = self.string(f"{key}.src", value["src"], expected)
            dst = value.get("dst") or ""
            self.string(f"{key}.dst", dst, expected)
            optional = self.boolean(f"{key}.optional", value.get("optional", False))
        else:
            raise self.fail(key, expected)
        src = self.expand(f"{key}", src)
        return CopyEntry(src, self.expand(f"{key}", dst) if dst else src, optional)

    def host(self, key: str, value: Any) -> str:
        text = self.string(key, value, "expected a host name string (HOST[:PORT[,PORT]][/udp])")
        templates = _TEMPLATE_RE.findall(text)
        for name in templates:
            if name not in HOST_TEMPLATES:
                raise self.fail(
                    key,
                    f"unknown template {{{name}}} "
                    f"(expected one of: {', '.join('{' + t + '}' for t in HOST_TEMPLATES)})",
                )
        if not templates:
            try:
                parse_host_spec(text, what=key)
            except UsageError as e:
                raise ProfileError(f"profile {self.label}: {e}") from None
        return text

    def published(self, key: str, value: Any) -> PortMapping:
        text = self.string(key, value, f"expected a string {PUBLISH_FORM} (8080:80)")
        try:
            return parse_publish(text, what=key)
        except UsageError as e:
            raise ProfileError(f"profile {self.label}: {e}") from None

    def port(self, key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
            raise self.fail(key, "expected a port number (1–65535)")
        return value

    def size(self, key: str, value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        if isinstance(value, str):
            try:
                return parse_size(value, what=key)
            except UsageError as e:
                raise ProfileError(f"profile {self.label}: key {e}") from None
        raise self.fail(key, "expected a size such as 512MiB or 2GiB")

    def duration(self, key: str, value: Any) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
        if isinstance(value, str):
            try:
                return parse_duration(value, what=key)
            except UsageError as e:
                raise ProfileError(f"profile {self.label}: key {e}") from None
        raise self.fail(key, "expected a duration such as 10m or 1h30m")

    def cidrs(self, key: str, value: Any) -> list[str]:
        text = self.string(key, value, "expected an address range such as 192.168.4.0/24")
        try:
            return parse_cidrs(text, what=key)
        except UsageError as e:
            raise ProfileError(f"profile {self.label}: key {e}") from None

    def tmpfs_path(self, key: str, value: Any) -> str:
        """An absolute path inside the sandbox, templates expanded, not / or a system tree."""
        text = os.path.normpath(self.expand(key, self.string(key, value, "expected a path")))
        if not text.startswith("/") or text == "/":
            raise self.fail(key, "expected an absolute path inside the sandbox (not /)")
        return text

    def secret_glob(self, key: str, value: Any) -> str:
        """A glob of the entries to cover, relative to each writable tree: a name
        (``*.secret``, any depth) or a path from the tree's top (``conf/prod/*.yaml``)."""
        text = self.string(key, value, "expected a glob string such as '*.secret' or 'conf/*.key'")
        comps = text.strip("/").split("/")
        if text.startswith("/") or "\0" in text or any(c in ("", ".", "..") for c in comps):
            raise self.fail(
                key,
                f"{text!r}: expected a glob relative to the work directory "
                "(no leading /, no . or .. components)",
            )
        return text.strip("/")

    def positive_int(self, key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(key, "expected a positive whole number")
        return value

    def positive_number(self, key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise self.fail(key, "expected a positive number")
        return float(value)


def _build(name: str, label: str, doc: Mapping[str, Any], context: Mapping[str, str]) -> Profile:
    """One profile document (without `extends`) checked into a Profile, key by key in
    the document's order of concerns: each error names LABEL and the key."""
    c = _Checker(label, context)
    c.keys(doc, _TOP_KEYS)
    p = Profile(name=name, source=label)
    if "description" in doc:
        p.description = c.string("description", doc["description"])
    _build_network(c, doc, p)
    _build_filesystem(c, doc.get("filesystem", {}), p)
    _build_env(c, doc, p)
    _build_limits(c, doc.get("limits", {}), p)
    return p


def _build_network(c: _Checker, doc: Mapping[str, Any], p: Profile) -> None:
    """net, seccomp, allow_hosts, allow_ports, allow_cidr and the booleans."""
    if "net" in doc:
        p.net = c.choice("net", doc["net"], NETS)
    if "seccomp" in doc:
        p.seccomp = c.choice("seccomp", doc["seccomp"], SECCOMP_MODES)
    for i, v in enumerate(c.list_of("allow_hosts", doc.get("allow_hosts", []))):
        p.allow_hosts.append(c.host(f"allow_hosts[{i}]", v))
    for i, v in enumerate(c.list_of("allow_ports", doc.get("allow_ports", []))):
        p.allow_ports.append(c.port(f"allow_ports[{i}]", v))
    for i, v in enumerate(c.list_of("allow_cidr", doc.get("allow_cidr", []))):
        p.allow_cidrs += c.cidrs(f"allow_cidr[{i}]", v)
    for i, v in enumerate(c.list_of("ports", doc.get("ports", []))):
        p.ports.append(c.published(f"ports[{i}]", v))
    for key in ("tailscale", "tty", "tty_raw"):
        if key in doc:
            setattr(p, key, c.boolean(key, doc[key]))


def _build_filesystem(c: _Checker, fs: Any, p: Profile) -> None:
    """filesystem.*: paths, copies, tmpfs directories, secrets patterns."""
    if not isinstance(fs, dict):
        raise c.fail("filesystem", f"expected a mapping with keys {', '.join(_FS_KEYS)}")
    c.keys(fs, _FS_KEYS, "filesystem.")
    for kind in ("ro", "rw", "mkdir", "protect", "reveal"):
        for i, v in enumerate(c.list_of(f"filesystem.{kind}", fs.get(kind, []))):
            getattr(p, kind).append(c.path_entry(f"filesystem.{kind}[{i}]", v))
    for kind in ("copy", "copy_ro"):
        for i, v in enumerate(c.list_of(f"filesystem.{kind}", fs.get(kind, []))):
            getattr(p, kind).append(c.copy_entry(f"filesystem.{kind}[{i}]", v))
    for i, v in enumerate(c.list_of("filesystem.tmpfs", fs.get("tmpfs", []))):
        p.tmpfs.append(c.tmpfs_path(f"filesystem.tmpfs[{i}]", v))
    for i, v in enumerate(c.list_of("filesystem.secrets", fs.get("secrets", []))):
        p.secrets.append(c.secret_glob(f"filesystem.secrets[{i}]", v))


def _build_env(c: _Checker, doc: Mapping[str, Any], p: Profile) -> None:
    """env (values, path templates filled now), env_pass and env_secrets (names)."""
    env = doc.get("env", {})
    if not isinstance(env, dict):
        raise c.fail("env", "expected a mapping of NAME: VALUE")
    for k, v in env.items():
        p.env[k] = _env_value(c, k, v)
    for list_key in ("env_pass", "env_secrets"):
        for i, v in enumerate(c.list_of(list_key, doc.get(list_key, []))):
            key = f"{list_key}[{i}]"
            try:
                name = check_name(c.string(key, v, "expected a variable name"), what=key)
            except UsageError as e:
                raise ProfileError(f"profile {c.label}: key {e}") from None
            getattr(p, list_key).append(name)


def _env_value(c: _Checker, k: Any, v: Any) -> str:
    """env.K's value checked, its path templates filled; the registry's (ENV_TEMPLATES)
    are kept for the run to resolve."""
    if not isinstance(k, str):
        raise c.fail(f"env.{k}", "expected a variable name")
    try:
        check_name(k, what="env")
    except UsageError as e:
        raise ProfileError(f"profile {c.label}: key {e}") from None
    # YAML reads 'false' and 1 as bool/int; an environment only holds strings.
    value = c.string(f"env.{k}", v, "expected a string (quote true/false and numbers)")
    if "\0" in value:
        raise c.fail(f"env.{k}", "the value contains a NUL byte")
    for name in _TEMPLATE_RE.findall(value):
        if name not in ENV_TEMPLATES and name not in PATH_TEMPLATES:
            known = (*ENV_TEMPLATES, *PATH_TEMPLATES)
            raise c.fail(
                f"env.{k}",
                f"unknown template {{{name}}} (expected one of: "
                f"{', '.join('{' + t + '}' for t in known)})",
            )
    return _TEMPLATE_RE.sub(
        lambda m: c.values[m.group(1)] if m.group(1) in PATH_TEMPLATES else m.group(0), value
    )


def _build_limits(c: _Checker, limits: Any, p: Profile) -> None:
    """limits.*: memory, pids, cpus, timeout."""
    if not isinstance(limits, dict):
        raise c.fail("limits", f"expected a mapping with keys {', '.join(_LIMIT_KEYS)}")
    c.keys(limits, _LIMIT_KEYS, "limits.")
    if "memory" in limits:
        p.memory = c.size("limits.memory", limits["memory"])
    if "pids" in limits:
        p.pids = c.positive_int("limits.pids", limits["pids"])
    if "cpus" in limits:
        p.cpus = c.positive_number("limits.cpus", limits["cpus"])
    if "timeout" in limits:
        p.timeout = c.duration("limits.timeout", limits["timeout"])


def _merge(base: Profile, child: Profile) -> Profile:
    """child extends base: lists concatenate (base first), scalars and env keys override."""
    out = Profile(name=child.name, source=child.source)
    out.description = child.description or base.description
    for attr in (
        "net",
        "memory",
        "pids",
        "cpus",
        "timeout",
        "seccomp",
        "tailscale",
        "tty",
        "tty_raw",
    ):
        child_value = getattr(child, attr)
        setattr(out, attr, child_value if child_value is not None else getattr(base, attr))
    for attr in (
        "allow_hosts",
        "allow_ports",
        "ro",
        "rw",
        "mkdir",
        "protect",
        "reveal",
        "copy",
        "copy_ro",
    ):
        setattr(out, attr, getattr(base, attr) + getattr(child, attr))
    out.env = {**base.env, **child.env}
    for attr in (
        "env_pass",
        "env_secrets",
        "allow_cidrs",
        "tmpfs",
        "secrets",
        "ports",
    ):  # no repeats
        got = getattr(base, attr)
        setattr(out, attr, got + [n for n in getattr(child, attr) if n not in got])
    return out


def load_profile(name_or_path: str, *, context: Mapping[str, str]) -> Profile:
    """Load, validate and expand a preset (a bare name) or a file (a value holding '/'
    or ending in .yaml/.yml). ``context`` holds 'workdir' and 'home' (and may hold
    'workdir_slug'). ``extends`` may name a preset or a file (relative to this one),
    one level deep."""
    label, text = _read(name_or_path, context.get("home"))
    doc = _parse_yaml(label, text)
    base_name = doc.get("extends")
    profile = _build(name_or_path, label, {k: v for k, v in doc.items() if k != "extends"}, context)
    if base_name is None:
        return profile
    if not isinstance(base_name, str) or not base_name:
        raise ProfileError(f"profile {label}: key extends: expected a profile name or path")
    if is_path(base_name) and not base_name.startswith("/") and is_path(name_or_path):
        base_name = os.path.normpath(os.path.join(os.path.dirname(name_or_path), base_name))
    # `node.yaml` of the user's that says `extends: node` means the preset
    base_label, base_text = _read(
        base_name, context.get("home"), preset_only=base_name == name_or_path
    )
    base_doc = _parse_yaml(base_label, base_text)
    if "extends" in base_doc:
        raise ProfileError(
            f"profile {label}: key extends: {base_name} extends another profile itself; "
            "only one level is supported"
        )
    return _merge(_build(base_name, base_label, base_doc, context), profile)


def project_doc(text: str, label: str) -> dict[str, Any]:
    """A .boxy.yaml parsed: profile keys, plus `profile: NAME` naming a preset or a
    user profile (never a file: one in the project could change after approval)."""
    doc = _parse_yaml(label, text, _ProjectLoader)
    if "extends" in doc:
        raise ProfileError(f"{label}: key extends: a project names its profile with profile: NAME")
    named = doc.get("profile")
    if named is not None and (not isinstance(named, str) or not named or is_path(named)):
        raise ProfileError(
            f"{label}: key profile: expected the name of a preset or of one of "
            f"your profiles ({user_dir()}/NAME.yaml), not a path"
        )
    return doc


def project_layer(
    base: Profile, doc: Mapping[str, Any], label: str, context: Mapping[str, str]
) -> Profile:
    """A .boxy.yaml's keys (DOC, from project_doc) on top of BASE, the profile it names
    or the run's: merged as `extends` merges; messages name both."""
    merged = _merge(
        base, _build(label, label, {k: v for k, v in doc.items() if k != "profile"}, context)
    )
    merged.name, merged.source = base.name, f"{base.source} + {label}"
    return merged


Registry = Callable[[str], "str | None"]


def _fill(text: str, registry: Registry | None) -> tuple[str, str | None]:
    """TEXT with its {templates} filled by REGISTRY, and the first one it could not
    fill (None when all were)."""
    missing: list[str] = []

    def sub(m: re.Match[str]) -> str:
        value = registry(m.group(1)) if registry else None
        if not value:
            missing.append(m.group(1))
            return ""
        return value

    filled = _TEMPLATE_RE.sub(sub, text)
    return filled, (missing[0] if missing else None)


def resolve_hosts(
    hosts: list[str], registry: Registry | None, *, source: str, notes: list[str]
) -> list[str]:
    """Fill HOST_TEMPLATES via ``registry`` (name → host, or None when the tool has no
    configuration). An entry that cannot be resolved, or resolves to something that is
    not a host name, is dropped with a note: the run goes on without that host."""
    out: list[str] = []
    for entry in hosts:
        text, missing = _fill(entry, registry)
        if missing:
            notes.append(
                f"profile {source}: allow_hosts {entry}: no {{{missing}}} configured; dropped"
            )
            continue
        try:
            out.append(str(parse_host_spec(text, what=f"profile {source}: allow_hosts {entry}")))
        except UsageError as e:
            notes.append(f"{e}; dropped")
    return out


def resolve_env(
    env: Mapping[str, str], registry: Registry | None, *, source: str, notes: list[str]
) -> dict[str, str]:
    """Fill ENV_TEMPLATES via ``registry``; a variable whose setting the tool does not
    have is left out (the tool then uses its own default), with a note."""
    out: dict[str, str] = {}
    for name, value in env.items():
        text, missing = _fill(value, registry)
        if missing:
            notes.append(f"profile {source}: env {name}: no {{{missing}}} configured; not set")
            continue
        out[name] = text
    return out
