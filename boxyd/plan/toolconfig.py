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
    prefix=_any,
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

_INI = re.compile(r"^\s*([^=:\s;#\[][^=]*?)\s*(?:=\s*(.*))?$")  # npm's ini: a bare key is true
_PIP_INI = re.compile(r"^\s*([^=:\s;#\[][^=:]*?)\s*[=:]\s*(.*)$")  # configparser
_YARNRC = re.compile(r"""^\s*("(?:[^"\\]|\\.)*"|[^\s#"]+)\s*(.*)$""")
_YAML_KEY = re.compile(r"""^[\s-]*["']?([^\s"':#{}\[\],]+)["']?\s*:(?:\s+(.*)|$)""")


def _pairs(fmt: str, text: str) -> list[tuple[str, str]]:
    """(key, value) of every line that looks like a setting, as the tool would split it."""
    pat = {"ini": _INI, "yarnrc": _YARNRC, "yaml": _YAML_KEY}[fmt]
    out = []
    for line in text.splitlines():
        if line.lstrip().startswith(("#", ";")):
            continue
        m = pat.match(line)
        if m:
            out.append((m.group(1).strip("\"'"), (m.group(2) or "true").strip()))
    return out


def _yaml_pairs(text: str) -> list[tuple[str, str]]:
    """Every mapping key of a YAML document at any depth (flow style too, which the
    line scan misses); nothing when it does not parse."""
    try:
        doc = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, ValueError):
        return []
    out: list[tuple[str, str]] = []
    stack = [doc]
    while stack and len(out) < 10000:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                out.append((str(k), str(v) if not isinstance(v, (dict, list)) else "{}"))
                stack.append(v)
        elif isinstance(node, list):
            stack.extend(node)
    return out


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
        m = _PIP_INI.match(line)
        if m and not line.lstrip().startswith(("#", ";")):
            out.append((m.group(1).removeprefix("--"), m.group(2)))
    return out
