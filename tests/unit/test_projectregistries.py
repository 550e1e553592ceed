"""The registries a project's .npmrc and pip.conf name, parsed by each tool's own
rules (npm: the `ini` package and @npmcli/config's env-replace; pip: configparser,
its sections and name normalisation)."""

from __future__ import annotations

import pytest

from boxyd import projectregistries as pr

ENV = {"HOME": "/home/u", "REG": "https://mirror.test/npm/"}


@pytest.mark.parametrize("text,expected", [
    ("registry=https://a.test/\n", [("registry", "https://a.test/")]),
    ("  registry  =  https://a.test/  \n", [("registry", "https://a.test/")]),
    ("registry=https://a.test/ ; a comment\n", [("registry", "https://a.test/")]),
    ("registry=https://a.test/ # a comment\n", [("registry", "https://a.test/")]),
    ('registry="https://a.test/"\n', [("registry", "https://a.test/")]),
    ("registry='https://a.test/'\n", [("registry", "https://a.test/")]),
    ('"registry"=https://a.test/\n', [("registry", "https://a.test/")]),
    ("registry=https://a.test/\r\nregistry=https://b.test/\r\n", [("registry", "https://b.test/")]),
    ("@corp:registry=https://corp.test/\n", [("@corp:registry", "https://corp.test/")]),
    ("registry=${REG}\n", [("registry", "https://mirror.test/npm/")]),
    ("registry=${UNSET?}https://c.test/\n", [("registry", "https://c.test/")]),
    ("registry=${UNSET}\n", [("registry", "${UNSET}")]),
    ("registry=\\${REG}\n", [("registry", "${REG}")]),
    ("@${SCOPE?}corp:registry=https://corp.test/\n", [("@corp:registry", "https://corp.test/")]),
    ("# registry=https://a.test/\n; registry=https://b.test/\n", []),
    ("[section]\nregistry=https://a.test/\n", []),  # nested: npm reads no settings there
    ("registry[]=https://a.test/\n", []),
    ("registry\n", []),  # a bare key is `true`
    ("registry=true\n", []),
    ("registry=https://a.test/\nregistry=\n", []),
    ("//a.test/:_authToken=secret\nalways-auth=true\n", []),
    ("scope:registry=https://nope.test/\n", []),  # a scope starts with @
])
def test_npmrc(text, expected):
    assert pr.parse_npmrc(text, ENV) == expected


@pytest.mark.parametrize("text,expected", [
    ("[global]\nindex-url = https://pypi.test/simple\n", [("global.index-url", "https://pypi.test/simple")]),
    ("[install]\nindex_url = https://i.test/simple\n", [("install.index-url", "https://i.test/simple")]),
    ("[global]\nINDEX-URL = https://i.test/\n", [("global.index-url", "https://i.test/")]),
    ("[global]\n--index-url = https://i.test/\n", [("global.index-url", "https://i.test/")]),
    ("[global]\nextra-index-url =\n  https://a.test/simple\n  https://b.test/simple\n",
     [("global.extra-index-url", "https://a.test/simple"),
      ("global.extra-index-url", "https://b.test/simple")]),
    ("[download]\nfind-links = https://f.test/wheels /local/dir\n",
     [("download.find-links", "https://f.test/wheels")]),
    ("[freeze]\nindex-url = https://x.test/\n", []),  # a command that fetches nothing
    ("[global]\ntrusted-host = x.test\ntimeout = 5\n", []),
    ("index-url = https://x.test/\n", []),  # no section: pip fails to load it
    ("[global\nindex-url = https://x.test/\n", []),
])
def test_pip_conf(text, expected):
    assert pr.parse_pip_conf(text) == expected


def test_primary_registries_and_the_hosts_beside_them():
    npm = pr.registries("/w/.npmrc", "npm", [("registry", "https://r.test/"),
                                             ("@corp:registry", "https://corp.test/")])
    pip = pr.registries("/w/.venv/pip.conf", "pip", [
        ("global.index-url", "https://g.test/simple"), ("install.index-url", "https://i.test/simple"),
        ("global.extra-index-url", "https://e.test/simple"),
        ("global.find-links", "https://user:pw@creds.test/")])
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


def test_resolver_orders_as_the_tools_do():
    regs = pr.registries("/w/.npmrc", "npm", [("registry", "https://r.test/")])
    user = {"npm_registry": "user.test", "pip_index": "pypi.test"}.get
    resolve = pr.resolver(user, regs, {})
    assert (resolve("npm_registry"), resolve("pip_index")) == ("r.test", "pypi.test")
    # an environment override beats the project's file, as in npm
    resolve = pr.resolver(user, regs, {"npm_config_registry": "https://env.test/"})
    assert resolve("npm_registry") == "user.test"
    assert pr.resolver(None, [], {})("npm_registry") is None


def test_credentials_in_a_url_are_never_repeated():
    r = pr.registries("/w/.npmrc", "npm", [("registry", "https://ci:s3cret@r.test/npm/")])[0]
    assert r.host is None and r.shown == "https://***@r.test/npm/"
    assert "s3cret" not in str(r.wire())
