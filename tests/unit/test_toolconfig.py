"""toolconfig.py: which keys of npm's, yarn's, pnpm's and pip's own configuration make
the tool run something or change what runs (pure), every key of every table."""

from __future__ import annotations

import pytest

from boxyd.plan import toolconfig as t

# a value that makes each key count; the tables' keys are normalised (no - _ .)
TRIGGER = {
    "ignorescripts": "false",
    "strictallowscripts": "false",
    "strictssl": "false",
    "ignorepnpmfile": "false",
    "ignoredepscripts": "false",
    "enablestrictssl": "false",
    "enablehardenedmode": "false",
    "checksumbehavior": "ignore",
    "keyringprovider": "subprocess",
    "location": "global",
}


def _value(key: str) -> str:
    return TRIGGER.get(t.norm(key), "true")


def _cases() -> list[tuple[str, str]]:
    out = []
    for name, (_, table, _) in t.TOOLS.items():
        out += [(name, key) for key in table]
    return out


def _line(name: str, key: str, value: str) -> bytes:
    fmt = t.TOOLS[name][2]
    if fmt == "yaml":
        return f"{key}: {value}\n".encode()
    if fmt == "yarnrc":
        return f"{key} {value}\n".encode()
    prefix = "[install]\n" if name.startswith("pip") else ""
    return f"{prefix}{key} = {value}\n".encode()


@pytest.mark.parametrize("name,key", _cases())
def test_every_key_counts(name: str, key: str) -> None:
    assert t.exec_keys(name, _line(name, key, _value(key))) == [key]


@pytest.mark.parametrize("name,key", _cases())
def test_commented_out_it_does_not(name: str, key: str) -> None:
    line = _line(name, key, _value(key)).removeprefix(b"[install]\n")
    assert t.exec_keys(name, b"# " + line) == []


@pytest.mark.parametrize(
    "name,data",
    [
        (".npmrc", b"ignore-scripts=true\n"),  # a setting that narrows
        (".npmrc", b"strict-ssl=true\nyes=false\n"),
        (".npmrc", b"//r.example/:_authToken=x\nsave-exact=true\nfund=false\nloglevel=warn\n"),
        (".npmrc", b"; node-options=--require=x\n"),
        (".yarnrc.yml", b"enableScripts: false\nnodeLinker: node-modules\nnpmAuthToken: x\n"),
        (".yarnrc.yml", b"checksumBehavior: throw\nenableHardenedMode: true\n"),
        (".yarnrc", b"--install.frozen-lockfile true\nnetwork-timeout 60000\n"),
        ("pip.conf", b"[global]\ntimeout = 60\nno-build-isolation = true\nsrc = ./src\n"),
        ("pip.conf", b"[global]\nkeyring-provider = disabled\nuser = false\n"),
        ("pnpm-workspace.yaml", b"packages:\n  - 'packages/*'\n"),
        ("package.json", b'{"scripts": {}}'),  # not a config file of theirs
    ],
)
def test_harmless_settings(name: str, data: bytes) -> None:
    assert t.exec_keys(name, data) == []


@pytest.mark.parametrize(
    "name,data,keys",
    [
        # npm's own spellings: scoped, array, quoted, bare (true), old dotted, env-expanded
        (".npmrc", b"@corp:registry=https://r.example/\n", ["@corp:registry"]),
        (".npmrc", b"allow-scripts[]=esbuild\n", ["allow-scripts[]"]),
        (".npmrc", b'"node-options" = "--require ./x.js"\n', ["node-options"]),
        (".npmrc", b"  script-shell  =  /tmp/sh\n", ["script-shell"]),
        (".npmrc", b"yes\n", ["yes"]),
        (".npmrc", b"init.module=./x.js\n", ["init.module"]),
        (".npmrc", b"${KEY}=--require=x\n", ["${KEY}"]),
        (".npmrc", b"node_options=x\nNODE-OPTIONS=y\n", ["node_options", "NODE-OPTIONS"]),
        (".npmrc", b"node-options=a\nnode-options=b\n", ["node-options"]),  # each key once
        # a second attack round (issue 31): a global install shadows the user's git; a
        # CA and a proxy of the payload's forge the registry's packages
        (".npmrc", b"global=true\nlocation=global\nlocation=project\n", ["global", "location"]),
        (
            ".npmrc",
            b"cafile=.certs/ca.pem\nhttps-proxy=http://127.0.0.1:1\n",
            ["cafile", "https-proxy"],
        ),
        (".yarnrc.yml", b"httpsProxy: http://127.0.0.1:1\n", ["httpsProxy"]),
        ("pip.conf", b"[global]\nproxy = http://127.0.0.1:1\n", ["proxy"]),
        # yarn classic: quoted keys, command-scoped flags
        (".yarnrc", b'"yarn-path" ".yarn/releases/y.cjs"\n', ["yarn-path"]),
        (
            ".yarnrc",
            b"--install.ignore-scripts false\n--*.ignore-scripts false\n",
            ["--install.ignore-scripts", "--*.ignore-scripts"],
        ),
        # yarn berry: nested keys, quoted keys, flow style
        (
            ".yarnrc.yml",
            b"npmScopes:\n  corp:\n    npmRegistryServer: https://r.example\n",
            ["npmRegistryServer"],
        ),
        (".yarnrc.yml", b'"yarnPath": .yarn/releases/y.cjs\n', ["yarnPath"]),
        (
            ".yarnrc.yml",
            b"{plugins: [{path: p.cjs}], enableScripts: true}\n",
            ["plugins", "enableScripts"],
        ),
        (".yarnrc.yml", b"plugins:\n  - path: .yarn/plugins/p.cjs\n", ["plugins"]),
        # pnpm's workspace file: camelCase, npm's keys too
        (
            "pnpm-workspace.yaml",
            b"onlyBuiltDependencies:\n  - evil\nscriptShell: /tmp/sh\n",
            ["onlyBuiltDependencies", "scriptShell"],
        ),
        # pip: any section, _ or -, a leading --, ':' as the separator
        ("pip.conf", b"[global]\nindex_url = https://i.example/simple\n", ["index_url"]),
        ("pip.ini", b"[install]\n--no-binary: :all:\n", ["no-binary"]),
        ("pip.conf", b"[freeze]\npython = /tmp/py\n", ["python"]),
    ],
)
def test_spellings(name: str, data: bytes, keys: list[str]) -> None:
    assert t.exec_keys(name, data) == keys


def test_settings_hold_the_values() -> None:
    assert t.exec_settings(".npmrc", b"node-options=--require=./h.js\nfund=false\n") == [
        ("node-options", "--require=./h.js")
    ]


def test_binary_and_unknown_never_raise() -> None:
    assert isinstance(t.exec_keys(".yarnrc.yml", bytes(range(256)) * 4), list)
    assert isinstance(t.exec_keys(".yarnrc.yml", b"a: &x [*x]\n" + b"- " * 10000), list)
    assert t.exec_keys("unknown", b"node-options=x") == []
