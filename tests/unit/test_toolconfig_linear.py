"""toolconfig.py's line scans and YAML reading, and projectregistries.py's .npmrc and
pip.conf parsers, in time linear in their input, and with the results they had when
the line scans were backtracking regexes and the YAML was safe_load's data walked as
is (a 64 KiB `.npmrc` line `a` + blanks + `b` took 56 s, a pip.conf one 70 s; 11 bytes
of `a: &a [*a]` never ended; a 4300-digit hex int raised out of exec_settings).

The oracle is the code before the change, verbatim (below, names as they were; the
one addition: a bound on the old YAML walk's steps, so that what never ended says so).
Where the old code returned, the new one returns the same, but for two kinds of YAML
document, where it returns more: one holding an alias (read once as written, not
expanded: the same pairs less the repeats, or also the value a repeated key
overrode), and one the old code gave up on for a scalar it could not build (a month
13, `!!int x`, an int of 5000 digits: kept as text now, the rest still counts).
Where the old code raised or never ended, the new one returns a list.
"""

from __future__ import annotations

import itertools
import random
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import yaml

from boxyd.config import projectregistries as pr
from boxyd.plan import toolconfig as t
from tests.unit import test_projectregistries as tpr
from tests.unit import test_toolconfig as ttc
from tests.unit.parserfuzz import assert_linear, mutations

# --- the oracle: boxyd/plan/toolconfig.py's scans before this change, verbatim --------

_INI = re.compile(r"^\s*([^=:\s;#\[][^=]*?)\s*(?:=\s*(.*))?$")  # npm's ini: a bare key is true
_PIP_INI = re.compile(r"^\s*([^=:\s;#\[][^=:]*?)\s*[=:]\s*(.*)$")  # configparser
_YARNRC = re.compile(r"""^\s*("(?:[^"\\]|\\.)*"|[^\s#"]+)\s*(.*)$""")
_YAML_KEY = re.compile(r"""^[\s-]*["']?([^\s"':#{}\[\],]+)["']?\s*:(?:\s+(.*)|$)""")


class _Unfinished(Exception):
    """The old walk went past any bound (an alias cycle: it never ended)."""


class _Unparsed(Exception):
    """The old _yaml_pairs caught an error and returned []."""


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


def _yaml_pairs(text: str, *, strict: bool = False) -> list[tuple[str, str]]:
    """Every mapping key of a YAML document at any depth (flow style too, which the
    line scan misses); nothing when it does not parse."""
    try:
        doc = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, ValueError):
        if strict:  # added: say so
            raise _Unparsed from None
        return []
    out: list[tuple[str, str]] = []
    stack = [doc]
    steps = 0  # added
    while stack and len(out) < 10000:
        steps += 1  # added
        if steps > 200_000:  # added
            raise _Unfinished
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                out.append((str(k), str(v) if not isinstance(v, (dict, list)) else "{}"))
                stack.append(v)
        elif isinstance(node, list):
            stack.extend(node)
    return out


def exec_settings(name: str, data: bytes, *, strict: bool = False) -> list[tuple[str, str]]:
    """The (key, value) settings of the config file NAME (a TOOLS name) that make its
    tool run something or change what runs, in file order."""
    tool = t.TOOLS.get(name)
    if tool is None:
        return []
    _, table, fmt = tool
    text = data.decode("utf-8", "replace")
    pairs = _pip_pairs(text) if table is t.PIP else _pairs(fmt, text)
    if fmt == "yaml":
        pairs += _yaml_pairs(text, strict=strict)
    out = []
    for key, value in pairs:
        checks = [table.get(n) for n in t._names(key)]
        if "${" in key or any(c is not None and c(value) for c in checks):
            out.append((key, value))
    return out


def _pip_pairs(text: str) -> list[tuple[str, str]]:
    out = []
    for line in text.splitlines():
        m = _PIP_INI.match(line)
        if m and not line.lstrip().startswith(("#", ";")):
            out.append((m.group(1).removeprefix("--"), m.group(2)))
    return out


# --- the oracle: projectregistries.py's JSON.parse before this change, verbatim ------


def _json_parse(text: str) -> tuple[str, bool] | None:
    """String(JSON.parse(TEXT)) and whether it is a string; None where JSON.parse
    throws. Linear time: an open array or object is a list entry, not a frame."""
    stack: list[list[str | None] | None] = []  # per open array its elements; None: an object
    pos = pr._ws(text, 0)
    while True:  # a value starts at POS
        value: pr._JSValue | None
        if text.startswith(("[", "{"), pos):
            stack.append([] if text[pos] == "[" else None)
            pos = pr._ws(text, pos + 1)
            if not text.startswith("]" if stack[-1] is not None else "}", pos):
                if stack[-1] is None and (pos := pr._json_key(text, pos)) < 0:
                    return None
                continue
            value, pos = _close(stack.pop()), pos + 1
        else:
            value, pos = pr._json_scalar(text, pos)
            if value is None:
                return None
        while True:  # VALUE ends before POS: into its container, closing those that end
            pos = pr._ws(text, pos)
            if not stack:
                return (
                    ("null" if value[0] is None else value[0], value[1])
                    if pos == len(text)
                    else None
                )
            top = stack[-1]
            if top is not None:
                top.append(value[0])
            if text.startswith(",", pos):
                pos = pr._ws(text, pos + 1)
                if top is None and (pos := pr._json_key(text, pos)) < 0:
                    return None
                break
            if not text.startswith("]" if top is not None else "}", pos):
                return None
            value, pos = _close(stack.pop()), pos + 1


def _close(elements: list[str | None] | None) -> pr._JSValue:
    """String() of a finished array (elements joined by ',', null as '') or object."""
    if elements is None:
        return "[object Object]", False
    return ",".join("" if e is None else e for e in elements), False


def _ini_unsafe(value: str) -> tuple[str, bool]:
    value = value.strip()
    if value and value[0] == value[-1] and value[0] in "\"'":
        inner = value[1:-1] if value[0] == "'" else value
        decoded = _json_parse(inner)
        if decoded is None:
            return inner, True
        return decoded
    out, esc = [], False
    for c in value:
        if esc:
            out.append(c if c in "\\;#" else "\\" + c)
            esc = False
        elif c in ";#":
            break
        elif c == "\\":
            esc = True
        else:
            out.append(c)
    if esc:
        out.append("\\")
    return "".join(out).strip(), True


def parse_npmrc(text: str, env: Mapping[str, str]) -> list[tuple[str, str]]:
    found: dict[str, str] = {}
    in_section = False
    for line in re.split(r"[\r\n]+", text):
        if not line.strip() or re.match(r"^\s*[;#]", line):
            continue
        m = pr._INI_LINE.match(line)
        if m is None:
            continue
        if m.group(1) is not None:
            in_section = True  # nested keys: npm does not read them as settings
            continue
        if in_section or m.group(3) is None:
            continue
        raw_key, key_is_string = _ini_unsafe(m.group(2))
        if key_is_string and raw_key.endswith("[]") and len(raw_key) > 2:
            continue  # an array: npm's registry settings are single strings
        key = pr.env_replace(raw_key, env)
        if key != "registry" and not (key.startswith("@") and key.endswith(":registry")):
            continue
        raw_value, value_is_string = _ini_unsafe(m.group(4))
        value = (pr.env_replace(raw_value, env) if value_is_string else raw_value).strip()
        if value in ("", "true", "false", "null"):
            found.pop(key, None)
            continue
        found[key] = value
    return list(found.items())


# --- inputs ---------------------------------------------------------------------------

REALISTIC = {
    ".npmrc": b"registry=https://registry.example.test/\n@corp:registry=https://npm.corp.example/\n"
    b"//npm.corp.example/:_authToken=${NPM_TOKEN}\nsave-exact=true\n"
    b'node-options="--max-old-space-size=4096"\nignore-scripts = false\n'
    b"allow-scripts[]=esbuild\n; c\n# c\n  yes\n[section]\nkey = value\n",
    ".yarnrc": b'# yarn lockfile v1\nregistry "https://yarn.example.test"\n'
    b'"--install.ignore-scripts" false\nyarn-path ".yarn/releases/yarn-1.22.19.cjs"\n'
    b'network-timeout 600000\n--*.frozen-lockfile true\ncache-folder "/tmp/c \\" d"\n',
    ".yarnrc.yml": b"nodeLinker: node-modules\nyarnPath: .yarn/releases/yarn-4.0.2.cjs\n"
    b'enableScripts: false\nnpmScopes:\n  corp:\n    npmRegistryServer: "https://n.example"\n'
    b"    npmAlwaysAuth: true\nplugins:\n  - path: .yarn/plugins/p.cjs\n"
    b'    spec: "@yarnpkg/plugin-workspace-tools"\npackageExtensions:\n  "debug@*":\n'
    b'    dependencies:\n      supports-color: "*"\nchecksumBehavior: update\n'
    b"defaults: &d {enableScripts: true, unsafeHttpWhitelist: [a.example]}\n"
    b"other: {<<: *d, cacheFolder: ./c}\n",
    "pnpm-workspace.yaml": b"packages:\n  - 'packages/*'\n  - '!**/test/**'\ncatalog:\n"
    b'  react: ^18.2.0\nonlyBuiltDependencies:\n  - esbuild\noverrides:\n  "foo@<1.2": ">=1.2.3"\n'
    b"patchedDependencies:\n  express@4.18.1: patches/express.patch\n"
    b"nodeOptions: --max-old-space-size=4096\nignoreScripts: no\nt: 2001-12-14\nh: 0x1F\n"
    b"s: 1:20:30\nf: 1.5e3\n? {complex: key}\n: v\n=: eq\n",
    "pip.conf": b"[global]\nindex-url = https://pypi.corp.example/simple\nextra-index-url =\n"
    b"    https://mirror.example/simple\ntrusted-host: pypi.corp.example\ntimeout = 60\n"
    b"[install]\n--no-binary: :all:\nuser = false\n; c\n# c\nkeyring_provider=subprocess\n",
}
REALISTIC["pip.ini"] = REALISTIC["pip.conf"].replace(b"\n", b"\r\n")
TOKENS = [
    b"&a ", b"*a", b"<<: ", b"[", b"]", b"{", b"}", b"- ", b"-", b": ", b":", b"=", b",",
    b'"', b"'", b"\\", b"${", b"}", b"?", b"\n", b"\n  ", b"\r\n", b"\t", b" ", b"#", b";",
    b"--", b"!!int ", b"!!timestamp ", b"!!bool ", b"!!set ", b"0x", b"1:", b"2020-13-45",
    b"yarnPath", b"enableScripts", b"node-options", b"index-url", b"[global]", b"\x00",
    b"\xc2\x85", b"\xe2\x80\xa8", b"\x0b", b"\xff",
]  # fmt: skip


def _rows(module: Any) -> Iterator[tuple[Any, ...]]:
    """The argument rows of every parametrized test of MODULE."""
    for name in dir(module):
        for mark in getattr(getattr(module, name), "pytestmark", ()):
            if mark.name == "parametrize":
                yield from (r if isinstance(r, tuple) else (r,) for r in mark.args[1])


def _existing_inputs() -> list[tuple[str, bytes]]:
    """test_toolconfig.py's inputs (every key of every table, and its cases) and the
    realistic files, each under every name."""
    out = [(n, ttc._line(n, k, ttc._value(k))) for n, k in ttc._cases()]
    out += [(n, b"# " + d) for n, d in out]
    out += [(r[0], r[1]) for r in _rows(ttc) if r[0] in t.TOOLS and isinstance(r[1], bytes)]
    return out + [(n, d) for n in t.TOOLS for d in REALISTIC.values()]


# --- linear -----------------------------------------------------------------------------


def _laughs(n: int) -> bytes:
    rows = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    while sum(map(len, rows)) < n:
        i = len(rows)
        rows.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return ("\n".join(rows) + "\n").encode()


def _merges(n: int) -> bytes:
    rows = ["m0: &m0 {yarnPath: x}"]
    while sum(map(len, rows)) < n:
        i = len(rows)
        rows.append(f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], k{i}: 1}}")
    return ("\n".join(rows) + "\n").encode()


SHAPES: dict[str, Callable[[int], bytes]] = {
    "blanks": lambda n: b"a" + b" " * n + b"b\n",
    "tabs": lambda n: b"a=" + b"\t" * n + b"=b",
    "key_blanks_no_equals": lambda n: b"k" + b" " * n + b"v\n",
    "key_blanks_colon": lambda n: b"k" + b" " * n + b"v: x\n",
    "brackets": lambda n: b"[" * n,
    "braces": lambda n: b"{" * n,
    "dash_blanks": lambda n: b"- " * (n // 2) + b"a:",
    "dashes": lambda n: b"-" * n + b"x",
    "quotes": lambda n: b'"' * n,
    "single_quotes": lambda n: b"'" * n,
    "backslashes": lambda n: b"\\" * n,
    "quoted_backslashes": lambda n: b'"' + b"\\\\" * (n // 2),
    "letters": lambda n: b"a" * n,
    "equals": lambda n: b"=" * n,
    "colons": lambda n: b"a" + b":" * n,
    "env": lambda n: b"${" * (n // 2),
    "lines": lambda n: b"a\n" * (n // 2),
}
YAML_SHAPES: dict[str, Callable[[int], bytes]] = {
    "alias_cycle": lambda n: b"a: &a [*a]\n" + b"b: *a\n" * (n // 6),
    "laughs": _laughs,
    "merges": _merges,
    "nested_open_close": lambda n: b"[" + (b"[" * 200 + b"]" * 200 + b",") * (n // 401) + b"]",
    "hex_int": lambda n: b"x: 0x" + b"f" * n,
    "decimal_int": lambda n: b"x: 1" + b"1" * n,
    "base60_int": lambda n: b"x: 1" + b":1" * (n // 2),
    "base60_tagged": lambda n: b"x: !!int 1" + b":-1" * (n // 3),
    "flow_keys": lambda n: b"{" + b"yarnPath: 1, " * (n // 13) + b"}",
}
NPMRC_SHAPES: dict[str, Callable[[int], bytes]] = {
    "json_nested": lambda n: b"registry='" + b"[" * n + b"'\n",
    "json_joined": lambda n: (
        b"registry='" + b"[" * (n // 4) + b'"' + b"a" * (n // 2) + b'",1' + b"]" * (n // 4) + b"'\n"
    ),
    "json_objects": lambda n: b"registry='" + b'[{"a":[1,' * (n // 9) + b"'\n",
}


def _npmrc(data: bytes) -> object:
    return pr.parse_npmrc(data.decode("utf-8", "replace"), tpr.ENV)


def _pip_conf(data: bytes) -> object:
    return pr.parse_pip_conf(data.decode("utf-8", "replace"))


def _settings(name: str) -> Callable[[bytes], object]:
    return lambda data: t.exec_settings(name, data)


PARSERS: dict[str, Callable[[bytes], object]] = {
    **{name: _settings(name) for name in t.TOOLS},
    "projectregistries npmrc": _npmrc,
    "projectregistries pip.conf": _pip_conf,
}
PIP_PARSERS = ("pip.conf", "pip.ini", "projectregistries pip.conf")
# one per format (pnpm-workspace.yaml and pip.ini are read as .yarnrc.yml and pip.conf)
SWEPT = [".npmrc", ".yarnrc", ".yarnrc.yml", "pip.conf", *list(PARSERS)[-2:]]


def _in_section(make: Callable[[int], bytes]) -> Callable[[int], bytes]:
    return lambda n: b"[global]\n" + make(n)  # past the header pip would stop without


def _shapes(parser: str) -> dict[str, Callable[[int], bytes]]:
    if parser in PIP_PARSERS:
        return {k: _in_section(make) for k, make in SHAPES.items()}
    if parser in (".yarnrc.yml", "pnpm-workspace.yaml"):
        return {**SHAPES, **YAML_SHAPES}
    if parser == "projectregistries npmrc":
        return {**SHAPES, **NPMRC_SHAPES}
    return SHAPES


SWEEP = [(p, s) for p in SWEPT for s in _shapes(p)]


@pytest.mark.parametrize("parser,shape", SWEEP)
def test_size_sweep_is_linear(parser: str, shape: str) -> None:
    assert_linear(_shapes(parser)[shape], PARSERS[parser], 1024, floor=0.02, rounds=2)


def _found(parser: str) -> list[bytes]:
    """The 64 KiB inputs that held boxyd (and their kin for PARSER's format)."""
    yaml_ones = [
        b"a: &a [*a]\n" + b" " * (64 << 10),
        _laughs(64 << 10),
        _merges(64 << 10),
        b"[" * 100_000,
        b"{" * 100_000,
        b"x: 0x" + b"1" * 4300 + b"\nyarnPath: y\n",
    ]
    ini = b"[global]\n" if parser in PIP_PARSERS else b""
    return [
        ini + b"a" + b" " * (64 << 10) + b"b\n",
        ini + b"k" + b" " * (64 << 10) + b"= v\n",
        *(yaml_ones if parser.endswith((".yml", ".yaml")) else []),
    ]


@pytest.mark.parametrize("parser", PARSERS)
def test_64_kib_under_a_second(parser: str) -> None:
    for data in _found(parser):
        t0 = time.process_time()
        PARSERS[parser](data)
        spent = time.process_time() - t0
        assert spent < 1.0, (parser, data[:40], spent)


# --- the same results as before -------------------------------------------------------


def test_line_scans_split_as_the_old_patterns() -> None:
    """Every line of up to 4 characters of an alphabet that exercises each pattern,
    and random longer ones: the same (key, value) as each old pattern's groups."""
    alphabet = " \t\u00a0-\"':a#=;[{,\\"

    def lines() -> Iterator[str]:
        for n in range(5):
            yield from map("".join, itertools.product(alphabet, repeat=n))
        rng = random.Random(5)
        for _ in range(30000):
            yield "".join(rng.choice(alphabet) for _ in range(rng.randint(5, 14)))

    def groups(m: re.Match[str] | None) -> tuple[str, str | None] | None:
        return (m.group(1), m.group(2)) if m else None

    for line in lines():
        assert t._ini_line(line, "=") == groups(_INI.match(line)), line
        pip = t._ini_line(line, "=:")
        assert (pip if pip and pip[1] is not None else None) == groups(_PIP_INI.match(line))
        assert t._yaml_line(line) == groups(_YAML_KEY.match(line)), line
        assert groups(t._YARNRC.match(line)) == groups(_YARNRC.match(line)), line


def _has_alias(text: str) -> bool:
    return any(isinstance(e, yaml.AliasEvent) for e in yaml.parse(text, Loader=yaml.SafeLoader))


def _agrees(name: str, data: bytes) -> None:
    """NAME's settings in DATA as before: the same list; for YAML the old code gave up
    on or that holds an alias, at least the same pairs; a list where it raised."""
    new = t.exec_settings(name, data)
    assert isinstance(new, list)
    try:
        old = exec_settings(name, data, strict=True)
    except _Unparsed:  # its YAML counted for nothing: the lines did
        assert set(exec_settings(name, data)) <= set(new), (data, new)
        return
    except Exception:  # never ended (_Unfinished), or raised (AttributeError, ValueError…)
        return
    if t.TOOLS[name][2] == "yaml" and _has_alias(data.decode("utf-8", "replace")):
        assert set(old) <= set(new), (data, old, new)
    else:
        assert new == old, (data, old, new)


def test_same_settings_as_before_on_the_existing_inputs() -> None:
    for name, data in _existing_inputs():
        _agrees(name, data)


@pytest.mark.parametrize("name", list(t.TOOLS))
def test_fuzz_same_settings_as_before(name: str) -> None:
    seeds = [REALISTIC[name], *(d for n, d in _existing_inputs() if n == name)]
    for data in mutations(seeds, TOKENS, seed=11):
        if len(data) < 1500:  # the old code is quadratic: past that it eats the budget
            _agrees(name, data)
        else:
            assert isinstance(t.exec_settings(name, data), list)


def test_npmrc_as_before() -> None:
    texts = [x for row in _rows(tpr) for x in row if isinstance(x, str)]
    seeds = [REALISTIC[".npmrc"], *tpr.NPMRC_SEEDS, *(x.encode() for x in texts)]
    cases = itertools.chain(seeds, mutations(seeds, tpr.NPMRC_TOKENS, seed=12))
    for data in cases:
        text = data.decode(errors="replace")
        assert pr.parse_npmrc(text, tpr.ENV) == parse_npmrc(text, tpr.ENV), text


def test_json_parse_as_before() -> None:
    rng = random.Random(9)
    atoms = ["[", "]", "{", "}", ",", ":", '"a"', "1", "-0", "1e21", "null", "true", " "]
    atoms += ['"\\u00e9"', '"x\\n"', '"\\q"', '"', "\\", "[null]", '{"k":[1,[2]]}', "[[]]"]
    for _ in range(30000):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 12)))
        assert pr._json_parse(text) == _json_parse(text), text
    deep = "[" * 3000 + '"x"' + ",[1,null]]" * 3000
    assert pr._json_parse(deep) == _json_parse(deep)


# --- what the new code reads that the old could not -----------------------------------


def test_an_alias_is_read_once_not_expanded() -> None:
    cyclic = b"a: &a [*a]\nyarnPath: y\n"
    assert t.exec_keys(".yarnrc.yml", cyclic) == ["yarnPath"]
    assert t.exec_keys("pnpm-workspace.yaml", b"a: &a {b: *a, nodeOptions: x}\n") == ["nodeOptions"]
    hidden = b"{x: &p ./evil.cjs, yarnPath: *p, plugins: [*p]}\n"  # no line of it is a key
    assert t.exec_settings(".yarnrc.yml", hidden) == [
        ("yarnPath", "./evil.cjs"),
        ("plugins", "{}"),
    ]
    merged = b"d: &d {enableScripts: true}\nx: {<<: *d}\n"
    assert ("enableScripts", "True") in t.exec_settings(".yarnrc.yml", merged)


def test_a_scalar_python_cannot_build_is_its_text() -> None:
    for scalar in (b"0x" + b"f" * 5000, b"1" * 5000, b"!!bool x", b"!!timestamp x", b"2020-13-45"):
        data = b"{yarnPath: y, v: " + scalar + b"}\n"
        assert ("yarnPath", "y") in t.exec_settings(".yarnrc.yml", data), scalar
    assert t._sexagesimal([1, -60, 0]) == 0  # past "1" the parts may cancel out
    if sys.get_int_max_str_digits() == 4300:  # Python's default
        assert t._sexagesimal([1] + [0] * 2000) == 60**2000
        assert t._sexagesimal([1] + [0] * 3000) is None
        tagged = b"{enableScripts: !!int 1" + b":0" * 3000 + b"}"
        assert t.exec_settings(".yarnrc.yml", tagged) == [("enableScripts", "1" + ":0" * 3000)]


def test_deep_documents_read_as_before() -> None:
    """No frame added per level: what safe_load read at a depth still reads."""
    for depth in (100, 300):
        data = b"x: " + b"[" * depth + b"{yarnPath: y}" + b"]" * depth + b"\n"
        assert t.exec_settings(".yarnrc.yml", data) == exec_settings(".yarnrc.yml", data)
        assert t.exec_keys(".yarnrc.yml", data) == ["yarnPath"]


def test_a_document_that_does_not_parse_is_read_by_lines_only() -> None:
    """As before: its YAML is unjudged, the line scan still counts."""
    data = b"yarnPath: y\n{plugins: [p.cjs]\n"
    assert t.exec_keys(".yarnrc.yml", data) == ["yarnPath"]
    assert t.exec_keys(".yarnrc.yml", b"[" * 100_000) == []
