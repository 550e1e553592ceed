"""The profile's schema: its keys, the values each takes, and the Profile a document
becomes. Every mistake comes back as one line naming the file, the key and what was
expected (the loader, profiles.py, reads the file; profilemerge.py layers one
profile on another).

Path templates ({workdir}, {home} …) are filled here; host and environment templates
for registries ({npm_registry}, {pip_index} …) are checked here and kept as written,
for profiles.resolve_hosts and resolve_env to fill at run time.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from boxy import caches, options
from boxy.errors import ProfileError, UsageError
from boxy.request import secret_hosts
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
# the keys, from the table of profile keys (boxy/options.py): the top level's in its
# order, `extends` (the loader's) after `description`; those under filesystem and limits
_TOP_KEYS = tuple(dict.fromkeys(["description", "extends", *(k.top for k in options.PROFILE_KEYS)]))
_SUB_KEYS = {
    top: tuple(k.path.partition(".")[2] for k in options.PROFILE_KEYS if k.top == top)
    for top in ("filesystem", "limits")
}
_FS_KEYS, _LIMIT_KEYS = _SUB_KEYS["filesystem"], _SUB_KEYS["limits"]
# Entries one key's list may hold: a real profile has tens. `extends`, a .boxy.yaml and
# the hold-back compare lists entry by entry (6,000 ports held a worker 40 s).
MAX_ENTRIES = 1024
TEMPLATE_RE = re.compile(r"\{([^{}]*)\}")


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
    ask: bool | None = None
    ask_timeout: float | None = None
    ask_notify: bool | None = None
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
    # trees a review lists but does not diff (node_modules, venvs): globs as secrets'
    generated: list[str] = field(default_factory=list)
    review: bool | None = None  # the work directory held for review (--review)
    tty: bool | None = None
    tty_raw: bool | None = None  # the terminal output unfiltered (--tty-raw)
    memory: int | None = None
    pids: int | None = None
    cpus: float | None = None
    timeout: float | None = None
    review_limit: int | None = None  # bytes the --review layer may hold (limits.review)
    seccomp: str | None = None


def workdir_slug(workdir: str) -> str:
    """The directory name Claude Code files a project's transcripts under.

    Claude Code replaces every character that is not an ASCII letter or digit with
    '-' (so '/home/u/p' → '-home-u-p'); doing the same also guarantees the slug can
    never hold a '/' or '..' that would climb out of ~/.claude/projects.
    """
    return re.sub(r"[^A-Za-z0-9]", "-", workdir)


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

    def name(self, key: str, value: Any) -> str:
        """A variable's name (env_pass, env_secrets)."""
        try:
            return check_name(self.string(key, value, "expected a variable name"), what=key)
        except UsageError as e:
            raise ProfileError(f"profile {self.label}: key {e}") from None

    def secret(self, key: str, value: Any) -> str:
        """An env_secrets entry: NAME, or NAME@HOST[,HOST…] (the value reaches those
        hosts alone, as --secret NAME@HOST), written back as NAME@host,host."""
        text = self.string(key, value, "expected NAME or NAME@HOST[,HOST…]")
        try:
            name, hosts = secret_hosts(text)
            check_name(name, what=key)
        except UsageError as e:
            raise ProfileError(f"profile {self.label}: key {key}: {e}") from None
        return f"{name}@{','.join(hosts)}" if hosts else name

    def env_value(self, name: Any, value: Any) -> str:
        return _env_value(self, name, value)

    def choice(self, key: str, value: Any, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise self.fail(key, f"expected one of: {', '.join(choices)}")
        return str(value)  # one of CHOICES: a str already

    def list_of(self, key: str, value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(key, "expected a list")
        if len(value) > MAX_ENTRIES:  # merging and holding back compare entries
            raise self.fail(key, f"{len(value)} entries (at most {MAX_ENTRIES})")
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

        path = TEMPLATE_RE.sub(sub, raw)
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
        templates = TEMPLATE_RE.findall(text)
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
        return int(self._amount(key, value, parse_size, "a size such as 512MiB or 2GiB", int))

    def duration(self, key: str, value: Any) -> float:
        return self._amount(key, value, parse_duration, "a duration such as 10m or 1h30m", float)

    def _amount(
        self,
        key: str,
        value: Any,
        parse: Callable[..., float],
        expected: str,
        kind: type[int] | type[float],
    ) -> float:
        """A positive number (KIND: int takes no fraction) or its text as the flag's."""
        number = (int,) if kind is int else (int, float)
        if isinstance(value, number) and not isinstance(value, bool) and value > 0:
            return kind(value)
        if isinstance(value, str):
            try:
                return parse(value, what=key)
            except UsageError as e:
                raise ProfileError(f"profile {self.label}: key {e}") from None
        raise self.fail(key, f"expected {expected}")

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


def build(name: str, label: str, doc: Mapping[str, Any], context: Mapping[str, str]) -> Profile:
    """One profile document (without `extends`) checked into a Profile, key by key in
    the table's order (boxy/options.py's PROFILE_KEYS): each error names LABEL and the
    key."""
    c = _Checker(label, context)
    c.keys(doc, _TOP_KEYS)
    for top, subs in _SUB_KEYS.items():
        if top in doc:
            section = doc[top]
            if not isinstance(section, dict):
                raise c.fail(top, f"expected a mapping with keys {', '.join(subs)}")
            c.keys(section, subs, f"{top}.")
    p = Profile(name=name, source=label)
    for key in options.PROFILE_KEYS:
        top, _, sub = key.path.partition(".")
        where = doc.get(top, {}) if sub else doc
        if (sub or top) in where:
            _take(c, key, where[sub or top], p)
    return p


def _take(c: _Checker, key: options.Key, value: Any, p: Profile) -> None:
    """KEY's VALUE, read by its CHECK, into P: one value, each entry of a list (a check
    may give several: a CIDR list), or each NAME: VALUE of a mapping."""
    read = getattr(c, key.check)
    if key.check == "choice":  # the values its option takes (--net, --seccomp)
        choices = options.choices(str(key.field))
        read = lambda k, v: c.choice(k, v, choices)  # noqa: E731
    if key.shape == "one":
        setattr(p, key.attr, read(key.path, value))
        return
    if key.shape == "map":
        if not isinstance(value, dict):
            raise c.fail(key.path, "expected a mapping of NAME: VALUE")
        getattr(p, key.attr).update({k: read(k, v) for k, v in value.items()})
        return
    out = getattr(p, key.attr)
    for i, v in enumerate(c.list_of(key.path, value)):
        got = read(f"{key.path}[{i}]", v)
        out.extend(got) if isinstance(got, list) else out.append(got)


def _env_value(c: _Checker, k: Any, v: Any) -> str:
    """env.K's value checked, its path templates filled; the registry's (ENV_TEMPLATES)
    are kept for the run to resolve (the checker's env_value)."""
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
    for name in TEMPLATE_RE.findall(value):
        if name not in ENV_TEMPLATES and name not in PATH_TEMPLATES:
            known = (*ENV_TEMPLATES, *PATH_TEMPLATES)
            raise c.fail(
                f"env.{k}",
                f"unknown template {{{name}}} (expected one of: "
                f"{', '.join('{' + t + '}' for t in known)})",
            )
    return TEMPLATE_RE.sub(
        lambda m: c.values[m.group(1)] if m.group(1) in PATH_TEMPLATES else m.group(0), value
    )
