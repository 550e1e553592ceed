"""Profiles: where they are (presets, the user's own, a file), read and parsed from
strict YAML, loaded (with the one level of `extends`) into a checked Profile; a
project's .boxy.yaml parsed; templates resolved at run time.

A profile is read once per run by the daemon, so every mistake in it must come
back as one line naming the file, the key and what was expected: the YAML here, the
keys and values in profileschema.py; profilemerge.py layers one profile on another.
Host templates for registries ({npm_registry}, {pip_index} …) are kept as written
and resolved later by ``resolve_hosts`` with a resolver the daemon supplies, because
the answer lives in the tool's own configuration, not in boxy.
"""

from __future__ import annotations

import copy
import importlib.resources
import json
import os
import re
import stat
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import yaml

from boxy.errors import ProfileError, UsageError
from boxy.paths import config_home
from boxy.values import parse_host_spec
from boxyd.config import parsedoor
from boxyd.config.parsedoor import Hostile, Job, Kind
from boxyd.config.profilemerge import merge
from boxyd.config.profileschema import TEMPLATE_RE, Profile, build

_PRESET_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]*")
_MAX_FILE = 1 << 20  # a profile is a screenful; refuse reading a runaway file into memory


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
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
        fd = os.open(path, flags)
    except OSError as e:
        raise ProfileError(f"profile {label}: {(e.strerror or str(e)).lower()}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ProfileError(f"profile {label}: not a regular file")
        return os.read(fd, _MAX_FILE + 1)
    finally:
        os.close(fd)


def _load_doc(
    name_or_path: str, home: str | None = None, *, preset_only: bool = False
) -> tuple[str, dict[str, Any]]:
    """(label for messages, document) of a preset, a user profile or a file. A preset is
    boxy's own, parsed here; any other file could have been written by a payload (a
    file in a project, a user profile under a --rw tree), so it is parsed apart, within
    a budget (parsedoor.py; docs/design.md, "Nothing the payload wrote is parsed in
    boxyd's process")."""
    label, text = _read(name_or_path, home, preset_only=preset_only)
    if where(name_or_path, home, preset_only=preset_only)[0] == "preset":
        return label, _parse_yaml(label, text)
    got = parsedoor.parse(Job(Kind.PROFILE, label, text.encode()))
    if isinstance(got, Hostile):
        raise ProfileError(f"profile {label}: could not be judged ({got.why})")
    if isinstance(got, dict) and isinstance(got.get("doc"), dict):
        return label, copy.deepcopy(got["doc"])  # (the door keeps the verdict it gave)
    if isinstance(got, dict) and isinstance(got.get("error"), str):
        raise ProfileError(got["error"])
    raise ProfileError(f"profile {label}: came back in no shape")


def _profile_job(job: Job) -> dict[str, Any]:
    """Kind.PROFILE, in the parse child: the document if it is plain data, or the
    ProfileError's line."""
    try:
        doc = _parse_yaml(job.arg, job.data.decode("utf-8"))
        json.dumps(doc, allow_nan=False)
    except ProfileError as e:
        return {"error": str(e)}
    except (TypeError, ValueError):
        return {"error": f"profile {job.arg}: holds a value that is not plain data (a date?)"}
    return {"doc": doc}


parsedoor.register(Kind.PROFILE, _profile_job)


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


def load_profile(name_or_path: str, *, context: Mapping[str, str]) -> Profile:
    """Load, validate and expand a preset (a bare name) or a file (a value holding '/'
    or ending in .yaml/.yml). ``context`` holds 'workdir' and 'home' (and may hold
    'workdir_slug'). ``extends`` may name a preset or a file (relative to this one),
    one level deep."""
    label, doc = _load_doc(name_or_path, context.get("home"))
    base_name = doc.get("extends")
    profile = build(name_or_path, label, {k: v for k, v in doc.items() if k != "extends"}, context)
    if base_name is None:
        return profile
    if not isinstance(base_name, str) or not base_name:
        raise ProfileError(f"profile {label}: key extends: expected a profile name or path")
    if is_path(base_name) and not base_name.startswith("/") and is_path(name_or_path):
        base_name = os.path.normpath(os.path.join(os.path.dirname(name_or_path), base_name))
    # `node.yaml` of the user's that says `extends: node` means the preset
    base_label, base_doc = _load_doc(
        base_name, context.get("home"), preset_only=base_name == name_or_path
    )
    if "extends" in base_doc:
        raise ProfileError(
            f"profile {label}: key extends: {base_name} extends another profile itself; "
            "only one level is supported"
        )
    return merge(build(base_name, base_label, base_doc, context), profile)


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

    filled = TEMPLATE_RE.sub(sub, text)
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
