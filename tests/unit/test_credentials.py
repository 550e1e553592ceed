"""credentials.py: which entries of a work tree are covered, and what the scrubbed copies
keep (pure)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from boxyd import credentials as c
from boxyd.credentials import Action


@pytest.mark.parametrize("parent,name,is_dir,kind,action", [
    ("proj", ".npmrc", False, "npm config", Action.SCRUB),
    ("proj", ".yarnrc.yml", False, "yarn config", Action.SCRUB),
    ("proj", ".pypirc", False, "PyPI config", Action.SCRUB),
    ("proj", ".netrc", False, "netrc", Action.SCRUB),
    ("proj", ".git-credentials", False, "git credentials", Action.SCRUB),
    (".docker", "config.json", False, "Docker config", Action.SCRUB),
    ("proj", ".env", False, "environment file", Action.EMPTY),
    ("proj", ".env.local", False, "environment file", Action.EMPTY),
    ("proj", ".env.production", False, "environment file", Action.EMPTY),
    ("proj", "id_rsa", False, "private key", Action.EMPTY),
    ("proj", "id_ed25519_deploy", False, "private key", Action.EMPTY),
    ("proj", "id_ecdsa", False, "private key", Action.EMPTY),
    ("proj", "server.pem", False, "private key", Action.EMPTY),
    ("proj", "tls.KEY", False, "private key", Action.EMPTY),
    ("proj", "cert.p12", False, "PKCS#12 key store", Action.EMPTY),
    ("proj", "store.pfx", False, "PKCS#12 key store", Action.EMPTY),
    ("proj", "credentials.json", False, "credentials file", Action.EMPTY),
    ("proj", ".aws", True, "AWS credentials", Action.EMPTY),
])
def test_covered(parent: str, name: str, is_dir: bool, kind: str, action: Action) -> None:
    rule = c.rule_for(parent, name, is_dir)
    assert rule is not None and (rule.kind, rule.action, rule.is_dir) == (kind, action, is_dir)


@pytest.mark.parametrize("parent,name,is_dir", [
    ("proj", ".env.example", False), ("proj", ".env.sample", False),
    ("proj", ".env.template", False), ("proj", ".env.dist", False), ("proj", ".env.Example", False),
    ("proj", "id_rsa.pub", False), ("proj", "id_ed25519.PUB", False),
    ("proj", "config.json", False),  # not under .docker
    ("proj", ".npmrc", True), ("proj", ".env", True),  # directories of those names
    ("proj", ".aws", False), ("proj", "environment", False), ("proj", "package.json", False),
    ("proj", ".envrc", False),
])
def test_not_covered(parent: str, name: str, is_dir: bool) -> None:
    assert c.rule_for(parent, name, is_dir) is None


@pytest.mark.parametrize("head,private", [
    (b"-----BEGIN RSA PRIVATE KEY-----\nMIIE", True),
    (b"junk\n-----BEGIN OPENSSH PRIVATE KEY-----\n", True),
    (b"-----BEGIN PRIVATE KEY-----\n", True),
    (b"-----BEGIN ENCRYPTED PRIVATE KEY-----\n", True),
    (b"-----BEGIN EC PRIVATE KEY-----\n", True),
    (b"-----BEGIN CERTIFICATE-----\nMIIB", False),
    (b"-----BEGIN PUBLIC KEY-----\n", False),
])
def test_pem_content(head: bytes, private: bool) -> None:
    assert c.holds_private_key(head) is private


def test_npmrc_keeps_the_registry_drops_every_token() -> None:
    data = (b"registry=https://npm.internal.example/\n"
            b"//npm.internal.example/:_authToken=npm_SECRET1\n"
            b"_auth = dXNlcjpTRUNSRVQy\n"
            b"//other.example/:_password=U0VDUkVUMw==\n"
            b"//other.example/:username=bob\n"
            b"@scope:registry=https://user:SECRET4@scoped.example/\n"
            b"always-auth=true\n")
    out = c.scrub_npmrc(data)
    assert b"SECRET" not in out and b"dXNlcjpTRUNSRVQy" not in out and b"U0VDUkVUMw" not in out
    assert b"registry=https://npm.internal.example/\n" in out
    assert b"@scope:registry=https://scoped.example/\n" in out
    assert b"always-auth=true" in out


def test_yarnrc_pypirc_netrc_git_credentials() -> None:
    yarn = c.scrub_yarnrc(b'npmRegistryServer: "https://r.example"\nnpmAuthToken: SECRET1\n'
                          b'npmScopes:\n  corp:\n    npmAuthIdent: "u:SECRET2"\n    npmAlwaysAuth: true\n')
    assert b"SECRET" not in yarn and b"npmRegistryServer" in yarn and b"npmAlwaysAuth" in yarn
    pypi = c.scrub_pypirc(b"[pypi]\nusername = __token__\npassword = pypi-SECRET\n[testpypi]\n"
                          b"repository = https://test.example/legacy/\n")
    assert b"SECRET" not in pypi and b"repository = https://test.example/legacy/" in pypi
    netrc = c.scrub_netrc(b"machine api.example login bob password SECRET1\n"
                          b"machine x.example\n  login alice\n  password SECRET2 account SECRET3\n")
    assert b"SECRET" not in netrc and b"machine api.example login bob" in netrc
    creds = c.scrub_urls(b"https://bob:ghp_SECRET@github.example\nhttps://x-token:SECRET2@gitlab.example\n")
    assert creds == b"https://github.example\nhttps://gitlab.example\n"


def test_docker_config() -> None:
    doc = {"auths": {"r.example": {"auth": "U0VDUkVU", "email": "a@b"},
                     "q.example": {"identitytoken": "SECRET"}}, "credsStore": "desktop"}
    out = json.loads(c.scrub_docker_config(json.dumps(doc).encode()))
    assert out == {"auths": {"r.example": {"email": "a@b"}, "q.example": {}}, "credsStore": "desktop"}
    assert c.scrub_docker_config(b"not json") == b"{}\n"


GIT_CONFIG = b"""[core]
\trepositoryformatversion = 0
[remote "origin"]
\turl = https://x-access-token:ghs_SECRET1@github.example/org/repo.git
\tfetch = +refs/heads/*:refs/remotes/origin/*
[http "https://github.example/"]
\textraheader = AUTHORIZATION: basic U0VDUkVUMg==
[http]
\tExtraHeader = "Authorization: Bearer SECRET3 \\
continued SECRET4"
\tsslVerify = true
[url "https://ci:SECRET5@git.example/"]
\tinsteadOf = https://git.example/
[credential "https://github.example"]
\tusername = bob-SECRET6
\thelper = store
[branch "main"]
\tremote = origin
"""


def test_git_config_scrubbed_and_still_read_by_git(tmp_path: Path) -> None:
    out = c.scrub_git_config(GIT_CONFIG)
    assert b"SECRET" not in out and b"U0VDUkVUMg" not in out
    path = tmp_path / "config"
    path.write_bytes(out)
    r = subprocess.run(["git", "config", "--file", str(path), "--list"], capture_output=True,
                       text=True, check=True)
    keys = dict(line.split("=", 1) for line in r.stdout.splitlines())
    assert keys["remote.origin.url"] == "https://github.example/org/repo.git"
    assert keys["branch.main.remote"] == "origin"
    assert keys["http.sslverify"] == "true"
    assert keys["url.https://git.example/.insteadof"] == "https://git.example/"
    assert keys["credential.https://github.example.helper"] == "store"
    assert not any("extraheader" in k or k.endswith(".username") for k in keys)


def test_git_config_key_on_the_header_line() -> None:
    assert b"SECRET" not in c.scrub_git_config(b"[http] extraheader = Authorization: SECRET\n")
