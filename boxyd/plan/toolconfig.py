"""Keys of the package managers' own configuration that make the tool run something or
change what it runs (pure: bytes in, key names out). A run that leaves such a key in
one of these files is reported at its end (execfiles.py); the node and python presets
make the files read-only.

Each table was read from the tool's own definitions: npm's ``@npmcli/config``
``definitions.js`` (npm 11), yarn classic's ``.yarnrc`` options and berry's
``.yarnrc.yml`` settings, pnpm's ``.npmrc``/``pnpm-workspace.yaml`` settings, pip's
long options (every one is a config key: ``ConfigOptionParser``). What counts:

- **runs**: a program or module the tool starts or loads (npm ``node-options``,
  ``script-shell``, ``git``, ``init-module``…; ``yarnPath``, ``plugins``; ``pnpmfile``;
  pip ``python``, ``keyring-provider``);
- **scripts**: re-enables install scripts a user's own config turned off (a project
  config outranks the user's in npm, yarn and pnpm): ``ignore-scripts=false``,
  ``enableScripts: true``, ``allow-scripts``, ``onlyBuiltDependencies``…;
- **config**: reads another file as the tool's config (``userconfig``,
  ``globalconfig``: its keys would be hidden from this check);
- **source**: where the code comes from, or whether it is checked (registries and
  indexes, TLS off, caches, checksums, overrides, patches, ``no-binary`` — which
  turns a wheel into a ``setup.py`` that runs), and **target**: where installed code
  lands (``prefix``, pip ``target``/``root``/``user``: another interpreter's path).

Not counted, deliberately: pip ``no-build-isolation`` (builds then use the venv's
own packages, which the payload can already write), ``src`` (a checkout directory),
timeouts, output, auth (masked instead: credentials.py).

Names are compared normalised (lower case, ``-`` and ``_`` dropped): npm writes
``node-options``, pnpm's workspace file ``nodeOptions``, pip accepts ``--no_binary``;
accepting every spelling errs towards reporting. A scoped key counts by its last
``:`` part (``@scope:registry``), a yarn classic ``--install.ignore-scripts`` by its
last ``.`` part. A key holding ``${`` is counted: npm expands the environment in keys,
so it may become any of these.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

import yaml

Value = Callable[[str], bool]  # whether a value makes the key count

_FALSE = frozenset({"false", "0", "no", "off", "n"})


def _any(_: str) -> bool:
    return True


def _falsy(v: str) -> bool:
    return v.strip().strip("\"'").lower() in _FALSE


def _truthy(v: str) -> bool:
    return not _falsy(v) and v.strip().strip("\"'") != ""


def _not(default: str) -> Value:
    return lambda v: v.strip().strip("\"'").lower() != default


def norm(key: str) -> str:
    return re.sub(r"[-_.]", "", key).lower()


def _table(**keys: Value) -> dict[str, Value]:
    return {norm(k): v for k, v in keys.items()}


# npm (definitions.js), and what pnpm and yarn classic read from .npmrc too
NPMRC = _table(
    # runs
    node_options=_any,
    script_shell=_any,
    shell=_any,
    git=_any,
    editor=_any,
    browser=_any,
    viewer=_any,
    node_gyp=_any,
    init_module=_any,
    onload_script=_any,
    call=_any,
    package=_any,
    yes=_truthy,  # npx installs and runs a package without asking
    # scripts
    ignore_scripts=_falsy,
    allow_scripts=_any,
    dangerously_allow_all_scripts=_truthy,
    strict_allow_scripts=_falsy,
    rebuild_bundle=_truthy,
    allow_git=_any,
    allow_remote=_any,
    allow_file=_any,
    allow_directory=_any,
    # config
    userconfig=_any,
    globalconfig=_any,
    # source, target
    registry=_any,
    replace_registry_host=_any,
    cache=_any,
    strict_ssl=_falsy,
    ca=_any,  # with a proxy: the registry's answers are the proxy's (a forged package)
    cafile=_any,
    proxy=_any,
    https_proxy=_any,
    noproxy=_any,
    prefix=_any,
    global_=_truthy,  # (npm's `global`) installs into the global prefix, on the user's PATH
    location=lambda v: v.strip().strip("\"'").lower() == "global",
    # pnpm's own keys in .npmrc
    pnpmfile=_any,
    global_pnpmfile=_any,
    ignore_pnpmfile=_falsy,
    shell_emulator=_truthy,
    use_node_version=_any,
    node_version=_any,
    unsafe_perm=_truthy,
    enable_pre_post_scripts=_truthy,
    only_built_dependencies=_any,
    only_built_dependencies_file=_any,
    never_built_dependencies=_any,
    dangerously_allow_all_builds=_truthy,
    ignore_dep_scripts=_falsy,
    verify_deps_before_run=_any,
    store_dir=_any,
    virtual_store_dir=_any,
    global_dir=_any,
    global_bin_dir=_any,
    side_effects_cache_readonly=_any,
    config_dependencies=_any,
)
# yarn classic's .yarnrc: its own keys, and npm's (it reads both)
YARNRC = {
    **NPMRC,
    **_table(
        yarn_path=_any,
        yarn_offline_mirror=_any,
        cache_folder=_any,
        global_folder=_any,
        offline_mirror=_any,
    ),
}
# yarn berry's .yarnrc.yml (every mapping key, at any depth: npmScopes.*.npmRegistryServer)
YARNRC_YML = _table(
    yarnPath=_any,
    plugins=_any,
    injectEnvironmentFiles=_any,
    enableScripts=_truthy,
    npmRegistryServer=_any,
    unsafeHttpWhitelist=_any,
    enableStrictSsl=_falsy,
    httpsCaFilePath=_any,
    caFilePath=_any,
    httpProxy=_any,
    httpsProxy=_any,
    cacheFolder=_any,
    globalFolder=_any,
    enableGlobalCache=_any,
    packageExtensions=_any,
    checksumBehavior=_not("throw"),
    enableHardenedMode=_falsy,
    approvedGitRepositories=_any,
    pnpUnpluggedFolder=_any,
    virtualFolder=_any,
    pnpDataPath=_any,
    enableMirror=_any,
)
# pnpm-workspace.yaml: pnpm's settings (camelCase) beside the package globs
PNPM_WORKSPACE = {
    **{k: v for k, v in NPMRC.items()},
    **_table(
        pnpmfilePath=_any,
        overrides=_any,
        patchedDependencies=_any,
        packageExtensions=_any,
        configDependencies=_any,
        executionEnv=_any,
        catalog=_any,
        catalogs=_any,
        allowBuilds=_any,
    ),
}
# pip: every long option is a config key, in any section ([global], [install]…)
PIP = _table(
    python=_any,
    keyring_provider=_not("disabled"),  # runs
    requirement=_any,
    constraint=_any,
    editable=_any,  # installs more, or other versions
    index_url=_any,
    extra_index_url=_any,
    find_links=_any,
    no_index=_any,
    trusted_host=_any,
    cert=_any,
    proxy=_any,
    cache_dir=_any,
    no_binary=_any,  # source
    global_option=_any,
    build_option=_any,
    install_option=_any,
    config_settings=_any,
    target=_any,
    prefix=_any,
    root=_any,
    user=_truthy,  # target
)

TOOLS = {  # file name -> (tool, table, format)
    ".npmrc": ("npm", NPMRC, "ini"),
    ".yarnrc": ("yarn", YARNRC, "yarnrc"),
    ".yarnrc.yml": ("yarn", YARNRC_YML, "yaml"),
    "pnpm-workspace.yaml": ("pnpm", PNPM_WORKSPACE, "yaml"),
    "pip.conf": ("pip", PIP, "ini"),
    "pip.ini": ("pip", PIP, "ini"),
}

# The line scans below take a line as these patterns would (kept here as their
# specification, and in the tests as the oracle), without running them: a lazy key
# followed by blanks backtracks once per character of the key (a 64 KiB `.npmrc` line
# `a` + blanks + `b` took 56 s).
#   ini:    ^\s*([^=:\s;#\[][^=]*?)\s*(?:=\s*(.*))?$     (npm's ini: a bare key is true)
#   pip:    ^\s*([^=:\s;#\[][^=:]*?)\s*[=:]\s*(.*)$       (configparser)
#   yaml:   ^[\s-]*["']?([^\s"':#{}\[\],]+)["']?\s*:(?:\s+(.*)|$)
# \s is str.isspace(), which strip() uses; splitlines() leaves no \n for $ or `.`.
# linear as it is: the quoted string's two alternatives start with different characters
# (no possessive quantifier on a group: CPython 3.11.2 matches wrongly there, gh-106052)
_YARNRC = re.compile(r"""^\s*("(?:[^"\\]|\\.)*"|[^\s#"]+)\s*(.*)$""")
_YAML_LEAD = re.compile(r"[\s-]*")
_YAML_NAME = re.compile(r"""[^\s"':#{}\[\],]+""")
_YAML_TAIL = re.compile(r"""["']?+\s*+:(?:\s+(.*)|$)""")
_INI_STARTS = frozenset("=:;#[")


def _ini_line(line: str, separators: str) -> tuple[str, str | None] | None:
    """(key, value) of an ini line, the key ending at the first of SEPARATORS; the
    value None where the line has none of them."""
    s = line.lstrip()
    if not s or s[0] in _INI_STARTS:
        return None
    cut = min((i for i in map(s.find, separators) if i >= 0), default=-1)
    if cut < 0:
        return s.rstrip(), None
    return s[:cut].rstrip(), s[cut + 1 :].lstrip()


def _yaml_line(line: str) -> tuple[str, str | None] | None:
    """(key, value) of a `key: value` line. Only a maximal name can be followed by
    the `:` the pattern needs, so the candidates are the name after the leading
    blanks and dashes (and a quote), then a name of the lead's last dash."""
    lead = _YAML_LEAD.match(line)
    end = lead.end() if lead else 0  # always a match: the pattern matches nothing too
    start = end + 1 if line[end : end + 1] in ('"', "'") else end
    for at in (start, line.rfind("-", 0, end)):
        name = _YAML_NAME.match(line, at) if at >= 0 else None
        tail = _YAML_TAIL.match(line, name.end()) if name else None
        if name and tail:
            return name.group(), tail.group(1)
    return None


def _pairs(fmt: str, text: str) -> list[tuple[str, str]]:
    """(key, value) of every line that looks like a setting, as the tool would split it."""
    out = []
    for line in text.splitlines():
        if line.lstrip().startswith(("#", ";")):
            continue
        if fmt == "ini":
            m = _ini_line(line, "=")
        elif fmt == "yaml":
            m = _yaml_line(line)
        else:
            y = _YARNRC.match(line)
            m = (y.group(1), y.group(2)) if y else None
        if m:
            out.append((m[0].strip("\"'"), (m[1] or "true").strip()))
    return out


_TAG = "tag:yaml.org,2002:"


class _Loader(yaml.SafeLoader):
    """yaml.safe_load's loader in linear time. PyYAML rescans every pending simple key
    (one per open flow level) at each token: 50 KiB of `[[…]]` took it 3.6 s. It also
    notes an alias: such a document is read as composed (_node_pairs)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.aliased = False

    def stale_possible_simple_keys(self) -> None:
        # the dict holds the keys in the order they were saved (a level's old one is
        # removed first), so by line and index: the stale ones come first
        keys = self.possible_simple_keys
        while keys:
            level, key = next(iter(keys.items()))
            if key.line == self.line and self.index - key.index <= 1024:
                return
            if key.required:
                raise yaml.scanner.ScannerError(
                    "while scanning a simple key", key.mark, "could not find expected ':'"
                )
            del keys[level]

    def next_possible_simple_key(self) -> int | None:
        # the first saved has the lowest token number
        for key in self.possible_simple_keys.values():
            number: int = key.token_number
            return number
        return None

    def fetch_alias(self) -> None:
        # noted by the scanner: a frame per level in the (recursive) composer would
        # make a deep document fail that safe_load reads
        self.aliased = True
        super().fetch_alias()


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    """SafeConstructor's int; its base-60 sum grows the number at every `:` part
    (quadratic), this one stops where str() could not show it."""
    text = loader.construct_scalar(node).replace("_", "")
    body = text[1:] if text[:1] in ("+", "-") else text
    if ":" not in body or body.startswith("0"):
        return loader.construct_yaml_int(node)
    value = _sexagesimal([int(part) for part in body.split(":")])
    if value is None:
        raise ValueError("more digits than str() shows")
    return -value if text[0] == "-" else value


def _sexagesimal(parts: list[int]) -> int | None:
    """PARTS as a base-60 number; None where it has more digits than str() shows.
    Once |value| is past every part it grows 59-fold or more per part left, so with
    enough parts left it is too long: the loop ends there, or ~2500 parts later."""
    limit = sys.get_int_max_str_digits()
    enough = int(limit / 1.77) + 1 if limit else len(parts)  # 59**enough > 10**limit
    most = max(1, *map(abs, parts))
    value = 0
    for left, part in enumerate(parts, 1 - len(parts)):
        value = value * 60 + part
        if -left >= enough and abs(value) >= most:
            return None
    return value


def _or_text(construct: Callable[[_Loader, yaml.ScalarNode], object]) -> Callable[..., object]:
    """CONSTRUCT, but a scalar it refuses (`!!int x`, a date of month 13, an int past
    str()'s 4300 digits) is kept as its text: the rest of the document still counts."""

    def construct_or_text(loader: _Loader, node: yaml.ScalarNode) -> object:
        try:
            return construct(loader, node)
        except (ValueError, LookupError, AttributeError, ArithmeticError):
            return loader.construct_scalar(node)

    return construct_or_text


for _name, _construct in (
    ("int", _construct_int),
    ("float", yaml.SafeLoader.construct_yaml_float),
    ("bool", yaml.SafeLoader.construct_yaml_bool),
    ("timestamp", yaml.SafeLoader.construct_yaml_timestamp),
):
    _Loader.add_constructor(_TAG + _name, _or_text(_construct))


def _text(value: object) -> str:
    try:
        return str(value)
    except ValueError:  # an int past str()'s 4300 digits: hex is exact, and linear
        return hex(value) if isinstance(value, int) else "?"


def _yaml_pairs(text: str) -> list[tuple[str, str]]:
    """Every mapping key of a YAML document at any depth (flow style too, which the
    line scan misses); nothing when it does not parse."""
    loader = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        if node is not None and loader.aliased:
            return _node_pairs(loader, node)
        doc = loader.construct_document(node) if node is not None else None
    except Exception:  # whatever PyYAML raises on hostile bytes: unparsed, as a YAMLError
        return []
    finally:
        if loader is not None:
            loader.dispose()
    out: list[tuple[str, str]] = []
    stack = [doc]
    while stack and len(out) < 10000:
        item = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                out.append((_text(k), _text(v) if not isinstance(v, (dict, list)) else "{}"))
                stack.append(v)
        elif isinstance(item, list):
            stack.extend(item)
    return out


def _node_pairs(loader: _Loader, root: yaml.Node) -> list[tuple[str, str]]:
    """The (key, value) pairs written in the mappings of a document with an alias,
    each mapping read once. safe_load's data would repeat a node per alias (`&a [*a]`
    never ends), and merge keys copy pairs (twice as many per level): what it lists
    is these pairs, some repeated, or the value a repeated key overrides."""
    out: list[tuple[str, str]] = []
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.ScalarNode) or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
            continue
        for key, value in node.value:
            if key.tag != _TAG + "merge":  # the pairs it copies are where it points
                out.append((_node_text(loader, key), _node_text(loader, value)))
            stack.append(value)
    return out


def _node_text(loader: _Loader, node: yaml.Node) -> str:
    """What _yaml_pairs shows for NODE's value: a collection as {} (its contents are
    listed on their own; a !!set too, whose str() safe_load would show)."""
    if not isinstance(node, yaml.ScalarNode):
        return "{}"
    if node.tag == _TAG + "value":  # a key `=`: flatten_mapping makes it a str
        return str(node.value)
    return _text(loader.construct_object(node))


def _names(key: str) -> tuple[str, str]:
    """The key as the tool looks it up: after a scope (``@s:registry``, ``//host/:x``),
    without an array suffix (``allow-scripts[]``); and its last dotted part
    (``--install.ignore-scripts``; ``init.module`` is also npm's old spelling)."""
    key = key.removeprefix("--").rsplit(":", 1)[-1].removesuffix("[]")
    return norm(key), norm(key.rsplit(".", 1)[-1])


def exec_settings(name: str, data: bytes) -> list[tuple[str, str]]:
    """The (key, value) settings of the config file NAME (a TOOLS name) that make its
    tool run something or change what runs, in file order."""
    tool = TOOLS.get(name)
    if tool is None:
        return []
    _, table, fmt = tool
    text = data.decode("utf-8", "replace")
    pairs = _pip_pairs(text) if table is PIP else _pairs(fmt, text)
    if fmt == "yaml":
        pairs += _yaml_pairs(text)
    out = []
    for key, value in pairs:
        checks = [table.get(n) for n in _names(key)]
        if "${" in key or any(c is not None and c(value) for c in checks):
            out.append((key, value))
    return out


def exec_keys(name: str, data: bytes) -> list[str]:
    """The keys of exec_settings, each once: e.g. ``['node-options']``."""
    return list(dict.fromkeys(k for k, _ in exec_settings(name, data)))


def _pip_pairs(text: str) -> list[tuple[str, str]]:
    out = []
    for line in text.splitlines():
        m = _ini_line(line, "=:")
        if m and m[1] is not None:
            out.append((m[0].removeprefix("--"), m[1]))
    return out
