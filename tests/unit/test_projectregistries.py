"""The registries a project's .npmrc and pip.conf name, parsed by each tool's own
rules (npm: the `ini` package and @npmcli/config's env-replace; pip: configparser,
its sections and name normalisation)."""

from __future__ import annotations

import time

import pytest

from boxyd.config import projectregistries as pr

ENV = {"HOME": "/home/u", "REG": "https://mirror.test/npm/"}


@pytest.mark.parametrize(
    "text,expected",
    [
        ("registry=https://a.test/\n", [("registry", "https://a.test/")]),
        ("  registry  =  https://a.test/  \n", [("registry", "https://a.test/")]),
        ("registry=https://a.test/ ; a comment\n", [("registry", "https://a.test/")]),
        ("registry=https://a.test/ # a comment\n", [("registry", "https://a.test/")]),
        ('registry="https://a.test/"\n', [("registry", "https://a.test/")]),
        ("registry='https://a.test/'\n", [("registry", "https://a.test/")]),
        ('"registry"=https://a.test/\n', [("registry", "https://a.test/")]),
        (
            "registry=https://a.test/\r\nregistry=https://b.test/\r\n",
            [("registry", "https://b.test/")],
        ),
        ("@corp:registry=https://corp.test/\n", [("@corp:registry", "https://corp.test/")]),
        ("registry=${REG}\n", [("registry", "https://mirror.test/npm/")]),
        ("registry=${UNSET?}https://c.test/\n", [("registry", "https://c.test/")]),
        ("registry=${UNSET}\n", [("registry", "${UNSET}")]),
        ("registry=\\${REG}\n", [("registry", "${REG}")]),
        (
            "@${SCOPE?}corp:registry=https://corp.test/\n",
            [("@corp:registry", "https://corp.test/")],
        ),
        ("# registry=https://a.test/\n; registry=https://b.test/\n", []),
        ("[section]\nregistry=https://a.test/\n", []),  # nested: npm reads no settings there
        ("registry[]=https://a.test/\n", []),
        ("registry\n", []),  # a bare key is `true`
        ("registry=true\n", []),
        ("registry=https://a.test/\nregistry=\n", []),
        ("//a.test/:_authToken=secret\nalways-auth=true\n", []),
        ("scope:registry=https://nope.test/\n", []),  # a scope starts with @
    ],
)
def test_npmrc(text: str, expected: list[tuple[str, str]]) -> None:
    assert pr.parse_npmrc(text, ENV) == expected


@pytest.mark.parametrize(
    "text,expected",
    [
        (
            "[global]\nindex-url = https://pypi.test/simple\n",
            [("global.index-url", "https://pypi.test/simple")],
        ),
        (
            "[install]\nindex_url = https://i.test/simple\n",
            [("install.index-url", "https://i.test/simple")],
        ),
        ("[global]\nINDEX-URL = https://i.test/\n", [("global.index-url", "https://i.test/")]),
        ("[global]\n--index-url = https://i.test/\n", [("global.index-url", "https://i.test/")]),
        (
            "[global]\nextra-index-url =\n  https://a.test/simple\n  https://b.test/simple\n",
            [
                ("global.extra-index-url", "https://a.test/simple"),
                ("global.extra-index-url", "https://b.test/simple"),
            ],
        ),
        (
            "[download]\nfind-links = https://f.test/wheels /local/dir\n",
            [("download.find-links", "https://f.test/wheels")],
        ),
        ("[freeze]\nindex-url = https://x.test/\n", []),  # a command that fetches nothing
        ("[global]\ntrusted-host = x.test\ntimeout = 5\n", []),
        ("index-url = https://x.test/\n", []),  # no section: pip fails to load it
        ("[global\nindex-url = https://x.test/\n", []),
    ],
)
def test_pip_conf(text: str, expected: list[tuple[str, str]]) -> None:
    assert pr.parse_pip_conf(text) == expected


def test_primary_registries_and_the_hosts_beside_them() -> None:
    npm = pr.registries(
        "/w/.npmrc",
        "npm",
        [("registry", "https://r.test/"), ("@corp:registry", "https://corp.test/")],
    )
    pip = pr.registries(
        "/w/.venv/pip.conf",
        "pip",
        [
            ("global.index-url", "https://g.test/simple"),
            ("install.index-url", "https://i.test/simple"),
            ("global.extra-index-url", "https://e.test/simple"),
            ("global.find-links", "https://user:pw@creds.test/"),
        ],
    )
    regs = npm + pip
    assert pr.template_value(regs, "npm_registry") == "r.test"
    assert pr.template_value(regs, "npm_registry_url") == "https://r.test/"
    assert pr.template_value(regs, "pip_index") == "i.test"  # [install] over [global]
    assert pr.template_value(regs, "pip_index_url") == "https://i.test/simple"
    assert pr.template_value(regs, "pip_files") is None
    assert pr.extra_hosts(regs, {"npm"}) == ["corp.test"]
    # the other index-url is approved beside it; a URL with credentials never is
    assert pr.extra_hosts(regs, {"pip"}) == ["g.test", "e.test"]
    assert pr.extra_hosts(regs, set()) == []


def test_resolver_orders_as_the_tools_do() -> None:
    regs = pr.registries("/w/.npmrc", "npm", [("registry", "https://r.test/")])
    user = {"npm_registry": "user.test", "pip_index": "pypi.test"}.get
    resolve = pr.resolver(user, regs, {})
    assert (resolve("npm_registry"), resolve("pip_index")) == ("r.test", "pypi.test")
    # an environment override beats the project's file, as in npm
    resolve = pr.resolver(user, regs, {"npm_config_registry": "https://env.test/"})
    assert resolve("npm_registry") == "user.test"
    assert pr.resolver(None, [], {})("npm_registry") is None


def test_credentials_in_a_url_are_never_repeated() -> None:
    r = pr.registries("/w/.npmrc", "npm", [("registry", "https://ci:s3cret@r.test/npm/")])[0]
    assert r.host is None and r.shown == "https://***@r.test/npm/"
    assert "s3cret" not in str(r.wire())


# --- .npmrc: the `ini` package JSON.parses a quoted value ------------------------------


@pytest.mark.parametrize("text,expected", [
    # the issue: 5,000 '[' in quotes made json.loads raise RecursionError in boxyd
    ("'" + "[" * 5000 + "'=https://a.test/\n", []),
    ("registry='" + "[" * 5000 + "'\n", [("registry", "[" * 5000)]),  # kept as written, as npm
    ("registry=\"" + "[" * 5000 + "\"\n", [("registry", "[" * 5000)]),  # a JSON string
    ("registry='" + "[" * 5000 + "]" * 5000 + "'\n", []),  # String([[…]]) is ''
    # JSON that is not a string is what JavaScript's String() makes of it
    ("'[\"registry\"]'=https://a.test/\n", [("registry", "https://a.test/")]),
    ("registry='[\"https://a.test/\"]'\n", [("registry", "https://a.test/")]),
    ("registry='[\"https://a.test/\", null, 1e21]'\n", [("registry", "https://a.test/,,1e+21")]),
    ("registry='{\"a\": 1}'\n", [("registry", "[object Object]")]),
    ("registry='null'\n", []),
    ("registry='[\"${REG}\"]'\n", [("registry", "${REG}")]),  # env-replace takes strings only
    ("registry='${REG}'\n", [("registry", "https://mirror.test/npm/")]),
    ('registry="\\u0068ttps://a.test/\\ud83d\\ude00"\n', [("registry", "https://a.test/\U0001f600")]),
    ("'[\"registry[]\"]'=https://a.test/\n", []),  # only a string key ends in [] for ini
    ("registry='\"https://a.test/\"'\n", [("registry", "https://a.test/")]),
    ("registry='https://a.test/'x'\n", [("registry", "https://a.test/'x")]),
    ("registry='\n", []),  # ini: '' (the quotes stripped, JSON.parse('') throws)
])  # fmt: skip
def test_npmrc_quoted_values_are_json_as_npm_reads_them(
    text: str, expected: list[tuple[str, str]]
) -> None:
    assert pr.parse_npmrc(text, ENV) == expected


@pytest.mark.parametrize("literal,shown", [
    ("1e21", "1e+21"), ("1e20", "100000000000000000000"), ("0.000001", "0.000001"),
    ("1e-7", "1e-7"), ("-1.5", "-1.5"), ("123e-2", "1.23"), ("1e400", "Infinity"),
    ("-1e400", "-Infinity"), ("-0", "0"), ("5e-324", "5e-324"), ("0.1", "0.1"),
    ("1.7976931348623157e308", "1.7976931348623157e+308"), ("1.25e2", "125"),
])  # fmt: skip
def test_json_numbers_as_javascript_prints_them(literal: str, shown: str) -> None:
    assert pr._js_number(literal) == shown


def test_json_parse_agrees_with_python_json_where_it_can_recurse() -> None:
    """A differential check on random JSON-ish text: the same accept/refuse and the
    same String() as Python's json module gives (NaN and Infinity aside: JSON.parse
    refuses them)."""
    import json
    import random

    def js(v: object) -> str:
        if isinstance(v, bool) or v is None:
            return json.dumps(v)
        if isinstance(v, int | float):
            return pr._js_number(repr(float(v)) if isinstance(v, float) else str(v))
        if isinstance(v, list):
            return ",".join("" if e is None else js(e) for e in v)
        return v if isinstance(v, str) else "[object Object]"

    def reference(text: str) -> tuple[str, bool] | None:
        def refuse(constant: str) -> None:
            raise ValueError(constant)

        try:
            v = json.loads(text, parse_constant=refuse)
        except ValueError:
            return None
        return js(v), isinstance(v, str)

    rng = random.Random(7)
    atoms = [
        "[",
        "]",
        "{",
        "}",
        ",",
        ":",
        '"a"',
        '"\\u00e9"',
        '"\\ud83d\\ude00"',
        '"\\ud800"',
        "1",
        "-0",
        "1.5e3",
        "1e21",
        "1e-7",
        "12345678901234567890123",
        "true",
        "false",
        "null",
        " ",
        "\n",
        '"x\\n"',
        '"\\q"',
        "01",
        '"',
        "\\",
        "nul",
        "1.",
        '"\x01"',
        "NaN",
        "[null]",
        '{"k":1}',
    ]
    for _ in range(20000):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 8)))
        assert pr._json_parse(text) == reference(text), text


NPMRC_SEEDS = [
    b'registry=https://a.test/\n@corp:registry = "https://corp.test/" ; c\n',
    b"'registry'='[\"https://a.test/\"]'\n//a.test/:_authToken=${TOKEN}\n[sec]\nx=1\n",
    b"registry=${REG}\nkey[]=1\nkey[]=2\n# c\n; c\nregistry=\\;x\\#y\n",
]
NPMRC_TOKENS = [
    b"[",
    b"]",
    b"{",
    b"}",
    b'"',
    b"'",
    b"=",
    b"\\",
    b";",
    b"#",
    b"${",
    b"}",
    b"?",
    b"\\u",
    b"\\ud800",
    b"\n",
    b"\r\n",
    b" ",
    b"\t",
    b"registry",
    b"@s:registry",
    b",",
    b":",
    b"1e400",
    b"null",
    b"\x00",
    b"\xe2\x80\xa8",
]


def test_fuzz_npmrc_never_raises() -> None:
    from tests.unit.parserfuzz import mutations

    for data in mutations(NPMRC_SEEDS, NPMRC_TOKENS, seed=2):
        for key, value in pr.parse_npmrc(data.decode(errors="replace"), ENV):
            assert isinstance(key, str) and isinstance(value, str)


def test_npmrc_size_sweep_is_linear() -> None:
    from tests.unit.parserfuzz import assert_linear

    run = lambda text: pr.parse_npmrc(text, ENV)  # noqa: E731
    assert_linear(lambda n: "registry='" + "[" * n + "'\n", run, 2000)
    assert_linear(lambda n: "registry='" + "[" * n + "]" * n + "'\n", run, 1000)
    assert_linear(lambda n: 'registry="' + "\\u0041" * n + '"\n', run, 1000)
    assert_linear(lambda n: "registry=a\n" * n, run, 200)
    assert_linear(lambda n: "registry=" + "${" * n + "\n", run, 1000)
    assert_linear(lambda n: "registry=" + "\\" * n + "${X}\n", run, 1000)


# --- pip.conf: configparser's rules, in linear time ------------------------------------


def test_pip_conf_long_blank_run_is_linear() -> None:
    """The issue: one 64 KiB line took configparser 20 s, once per venv."""
    t0 = time.process_time()
    assert pr.parse_pip_conf("[global]\na" + " " * 65500 + "b\n") == []
    assert pr.parse_pip_conf("[global]\n" + "a\n" * 32000) == []  # 3 s: ParsingError's message
    assert pr.parse_pip_conf("[global]\nindex-url" + " " * 65000 + "= https://a.test/\n") == [
        ("global.index-url", "https://a.test/")
    ]
    assert time.process_time() - t0 < 1.0


@pytest.mark.parametrize("text,expected", [
    ("[DEFAULT]\nindex-url = https://d.test/\n[global]\nx = 1\n",
     [("global.index-url", "https://d.test/")]),  # items() holds DEFAULT's
    ("[global]\nindex-url = https://a.test/\n[global]\n", []),  # DuplicateSectionError
    ("[global]\nindex-url = https://a.test/\nINDEX-URL = https://b.test/\n", []),  # duplicate
    ("[global]\nindex-url = https://a.test/\nbogus line\n", []),  # ParsingError
    ("[global]\n= https://a.test/\n", []),
    ("[global]junk\nindex-url: https://a.test/\n", [("global.index-url", "https://a.test/")]),
    ("[global]\nextra-index-url = https://a.test/\n\n  # c\n  https://b.test/\n",
     [("global.extra-index-url", "https://a.test/"), ("global.extra-index-url", "https://b.test/")]),
    ("[global]\r\nindex-url = https://a.test/\r\n", [("global.index-url", "https://a.test/")]),
])  # fmt: skip
def test_pip_conf_configparser_rules(text: str, expected: list[tuple[str, str]]) -> None:
    assert pr.parse_pip_conf(text) == expected


def configparser_reference(text: str) -> list[tuple[str, list[tuple[str, str]]]] | None:
    import configparser

    parser = configparser.RawConfigParser()
    try:
        parser.read_string(text)
    except configparser.Error:
        return None
    return [(s, parser.items(s)) for s in parser.sections()]


def test_pip_conf_agrees_with_configparser() -> None:
    """A differential check against pip's own parser on random small files."""
    import random

    rng = random.Random(3)
    atoms = [
        "[global]",
        "[DEFAULT]",
        "[install]",
        "[",
        "]",
        "=",
        ":",
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "#",
        ";",
        "a",
        "B",
        "index-url",
        "\u2028",
        "\x0b",
        "\x85",
        "\u00a0",
        "[a]b",
        "[]",
        "[]]",
        " = ",
        "\n  ",
        "\n\n",
    ]
    for _ in range(8000):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 14)))
        assert pr._configparser_items(text) == configparser_reference(text), text


PIP_SEEDS = [
    b"[global]\nindex-url = https://a.test/simple\nextra-index-url =\n  https://b.test/\n",
    b"[DEFAULT]\ntimeout: 5\n[install]\n--index_url=https://c.test/\nfind-links = /x https://d.test/\n",
]
PIP_TOKENS = [
    b"[",
    b"]",
    b"=",
    b":",
    b" ",
    b"\t",
    b"\n",
    b"\r",
    b"#",
    b";",
    b"[global]",
    b"[DEFAULT]",
    b"\n  ",
    b"index-url",
    b"\x00",
    b"\xc2\xa0",
    b"%(x)s",
]


def test_fuzz_pip_conf_agrees_with_configparser() -> None:
    from tests.unit.parserfuzz import mutations

    for data in mutations(PIP_SEEDS, PIP_TOKENS, seed=3):
        text = data.decode(errors="replace")
        got = pr._configparser_items(text)
        if len(text) < 2000:  # configparser itself is quadratic past that
            assert got == configparser_reference(text), text
        pr.parse_pip_conf(text)


def test_pip_conf_size_sweep_is_linear() -> None:
    from tests.unit.parserfuzz import assert_linear

    assert_linear(lambda n: "[global]\na" + " " * n + "b\n", pr.parse_pip_conf, 4000)
    assert_linear(lambda n: "[global]\n" + "a\n" * n, pr.parse_pip_conf, 1000)
    assert_linear(
        lambda n: "[global]\n" + "".join(f"k{i} = v\n  more\n" for i in range(n)),
        pr.parse_pip_conf,
        300,
    )
