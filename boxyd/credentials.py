"""Credentials in the work tree, and what the payload is shown instead (pure: names and
bytes in, verdicts and bytes out).

The work directory is the project, and projects hold credentials: a CI checkout keeps
its token in ``.git/config`` (``http.<url>.extraheader``), ``.npmrc``/``.yarnrc.yml``/
``.pypirc`` hold registry tokens — with those a worm publishes itself through the one
registry the allowlist opens — and ``.env`` files hold API keys. By default each is
covered by a read-only stand-in (a mount point: it can be neither read through nor
replaced):

- **scrub**: a copy without the auth lines, so the tool's other settings (a project
  registry, remotes, branches) still work — ``.npmrc``, ``.yarnrc.yml``, ``.pypirc``,
  ``.netrc``, ``.git-credentials``, ``.docker/config.json`` and git's own config
  files (``http.*.extraheader``, ``credential.*`` user names, and userinfo in any
  URL removed). Only a file that had something to remove is covered;
- **empty**: an empty file or directory — ``.env`` and ``.env.*`` (not the
  example/sample/template/dist ones), private keys (``id_rsa*``, ``id_ed25519*``,
  ``id_ecdsa*``, ``id_dsa*`` but not ``*.pub``; ``*.pem``/``*.key`` holding a
  PRIVATE KEY block), ``.aws/``, ``credentials.json``, ``*.p12``/``*.pfx``.

``node_modules`` is not searched: what is in it came from the registry, public by
definition (and covering files in it would pin directories npm must replace).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum


class Action(Enum):
    SCRUB = "scrub"  # a sanitized copy
    EMPTY = "empty"  # an empty file or directory


@dataclass(frozen=True)
class Rule:
    kind: str  # what it is, for the user: "npm config", "private key", …
    action: Action
    is_dir: bool = False
    needs_content: bool = False  # decided by content (a PEM block), or scrubbed


SKIP_DIRS = frozenset({"node_modules", ".git"})  # not searched (.git: by git's own rules)
_ENV_KEEP = frozenset({"example", "sample", "template", "dist"})
_KEY_NAMES = ("id_rsa", "id_ed25519", "id_ecdsa", "id_dsa")
KEY_PROBE = 64 << 10  # bytes of a .pem/.key read to look for a PRIVATE KEY block
SCRUB_MAX = 4 << 20  # a config larger than this is covered empty instead of scrubbed

_SCRUBBED = {
    ".npmrc": "npm config",
    ".yarnrc.yml": "yarn config",
    ".pypirc": "PyPI config",
    ".netrc": "netrc",
    ".git-credentials": "git credentials",
}


def rule_for(parent: str, name: str, is_dir: bool) -> Rule | None:
    """What covers the entry NAME of a directory whose own name is PARENT, if anything."""
    lower = name.lower()
    if is_dir:
        return Rule("AWS credentials", Action.EMPTY, is_dir=True) if name == ".aws" else None
    if name in _SCRUBBED:
        return Rule(_SCRUBBED[name], Action.SCRUB, needs_content=True)
    if parent == ".docker" and name == "config.json":
        return Rule("Docker config", Action.SCRUB, needs_content=True)
    if name == ".env" or (name.startswith(".env.") and name[5:].lower() not in _ENV_KEEP):
        return Rule("environment file", Action.EMPTY)
    if lower.startswith(_KEY_NAMES) and not lower.endswith(".pub"):
        return Rule("private key", Action.EMPTY)
    if lower.endswith((".pem", ".key")):
        return Rule("private key", Action.EMPTY, needs_content=True)
    if lower.endswith((".p12", ".pfx")):
        return Rule("PKCS#12 key store", Action.EMPTY)
    if name == "credentials.json":
        return Rule("credentials file", Action.EMPTY)
    return None


def holds_private_key(head: bytes) -> bool:
    """A PEM private key of any kind (RSA, EC, OPENSSH, ENCRYPTED, plain PKCS#8)."""
    return bool(re.search(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----", head))


# --- scrubbing -------------------------------------------------------------------------

# scheme://user[:password]@ — the userinfo of a URL, wherever it appears
_USERINFO = re.compile(rb"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s\"']+@")
_NPM_SECRET_KEYS = frozenset({"_authtoken", "_auth", "_password", "password", "token",
                              "certfile", "keyfile"})
_YARN_SECRET_KEYS = frozenset({"npmauthtoken", "npmauthident", "npmpassword"})
_PYPI_SECRET_KEYS = frozenset({"password", "token"})
_INI_KEY = re.compile(rb"^\s*([^=:\s]+)\s*[=:]")  # Python's configparser (.pypirc)
_NPM_KEY = re.compile(rb"^\s*([^=\s][^=]*?)\s*=")  # npm's ini: the key may hold ':'

_YAML_KEY = re.compile(rb"^\s*[\"']?([A-Za-z0-9_]+)[\"']?\s*:")
_NETRC_SECRET = re.compile(rb"\b(password|account)\s+\S+")
_GIT_SECTION = re.compile(rb"^\s*\[\s*([A-Za-z0-9.-]+)")
_GIT_KEY = re.compile(rb"^\s*([A-Za-z][A-Za-z0-9-]*)\s*(=|$)")


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def _drop_keys(data: bytes, key: re.Pattern[bytes], secret: frozenset[str]) -> bytes:
    """Every line whose key (KEY's group 1, lower-cased, after its last ':') is in
    SECRET dropped; the userinfo of every URL left removed."""
    out = []
    for line in _lines(data):
        m = key.match(line)
        if not (m and m.group(1).rsplit(b":", 1)[-1].lower().decode("latin-1") in secret):
            out.append(line)
    return _USERINFO.sub(rb"\1", b"".join(out))


def scrub_npmrc(data: bytes) -> bytes:
    """Drop ``_authToken``, ``_auth``, ``_password``… — also scoped, as npm writes them
    (``//registry.example/:_authToken=…``); keep the registry settings."""
    return _drop_keys(data, _NPM_KEY, _NPM_SECRET_KEYS)


def scrub_yarnrc(data: bytes) -> bytes:
    return _drop_keys(data, _YAML_KEY, _YARN_SECRET_KEYS)


def scrub_pypirc(data: bytes) -> bytes:
    return _drop_keys(data, _INI_KEY, _PYPI_SECRET_KEYS)


def scrub_netrc(data: bytes) -> bytes:
    return _NETRC_SECRET.sub(b"", data)


def scrub_urls(data: bytes) -> bytes:
    """``.git-credentials``: one URL with its userinfo per line; what is left is harmless."""
    return _USERINFO.sub(rb"\1", data)


def scrub_docker_config(data: bytes) -> bytes:
    """``auths.*.auth``/``identitytoken``/``registrytoken``/``password`` removed; a file
    that is not JSON becomes ``{}`` (it cannot be scrubbed, so nothing of it is shown)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return b"{}\n"
    if not isinstance(doc, dict):
        return b"{}\n"
    auths = doc.get("auths")
    if isinstance(auths, dict):
        for entry in auths.values():
            if isinstance(entry, dict):
                for key in ("auth", "identitytoken", "registrytoken", "password"):
                    entry.pop(key, None)
    return (json.dumps(doc, indent="\t") + "\n").encode()


def scrub_git_config(data: bytes) -> bytes:
    """git's config without ``http.*.extraheader`` (a CI checkout's token) and
    ``credential.*.username``, and with the userinfo removed from every URL — in
    values and in section names (``[url "https://x:TOKEN@host/"]``). A key continued
    over several lines (a trailing backslash) goes whole."""
    out = []
    section = b""
    dropping = False
    for line in _lines(data):
        if dropping:  # the continuation of a dropped value
            dropping = line.rstrip(b"\r\n").endswith(b"\\")
            continue
        sect = _GIT_SECTION.match(line)
        if sect:
            section = sect.group(1).split(b".", 1)[0].lower()
            # a key may follow the header on the same line: "[http] extraheader = …"
            rest = line[line.find(b"]") + 1 :] if b"]" in line else b""
            key = _GIT_KEY.match(rest)
            if key and _git_secret(section, key.group(1).lower()):
                line = line[: line.find(b"]") + 1] + b"\n"
        else:
            key = _GIT_KEY.match(line)
            if key and _git_secret(section, key.group(1).lower()):
                dropping = line.rstrip(b"\r\n").endswith(b"\\")
                continue
        out.append(line)
    return _USERINFO.sub(rb"\1", b"".join(out))


def _git_secret(section: bytes, key: bytes) -> bool:
    return (section == b"http" and key == b"extraheader") or (
        section == b"credential" and key in (b"username", b"password")
    )


_SCRUBBERS = {
    "npm config": scrub_npmrc,
    "yarn config": scrub_yarnrc,
    "PyPI config": scrub_pypirc,
    "netrc": scrub_netrc,
    "git credentials": scrub_urls,
    "Docker config": scrub_docker_config,
    "git config": scrub_git_config,
}

GIT_CONFIG = Rule("git config", Action.SCRUB, needs_content=True)


def scrub(rule: Rule, data: bytes) -> bytes:
    """The stand-in's content for a SCRUB rule."""
    return _SCRUBBERS[rule.kind](data)
