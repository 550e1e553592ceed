"""Credentials in the work tree, and what the payload is shown instead (pure: names and
bytes in, verdicts and bytes out).

The work directory is the project, and projects hold credentials: a CI checkout keeps
its token in ``.git/config`` (``http.<url>.extraheader``), ``.npmrc``/``.yarnrc.yml``/
``.pypirc`` hold registry tokens — with those a worm publishes itself through the one
registry the allowlist opens — and ``.env`` files hold API keys. By default each is
covered by a read-only stand-in (a mount point: it can be neither read through nor
replaced):

- **scrub**: a copy without the auth lines, so the tool's other settings (a project
  registry, remotes, branches) still work — git's own config files and what they
  include, ``.npmrc``, ``.yarnrc``/``.yarnrc.yml``, ``pip.conf``, ``.pypirc``,
  Poetry's, cargo's config, Composer's ``auth.json``, Bundler's, Docker's,
  Terraform's, kubeconfigs, ``.netrc``… (the table below: ``_BY_NAME``,
  ``_BY_PARENT``). Only a file that had something to remove is covered;
- **empty**: an empty file or directory — ``.env`` and ``.env.*`` (not the
  example/sample/template/dist ones), private keys, files that hold nothing but
  credentials (cargo's, RubyGems', Terraform's, Rails' keys, ``.pgpass``…), the cloud
  CLIs' directories (``.aws/``, ``.azure/``, ``.config/gcloud/``), and the profile's
  own patterns (``filesystem.secrets``: ``user_rule``).

``node_modules`` is not searched: what is in it came from the registry, public by
definition (and covering files in it would pin directories npm must replace).
"""

from __future__ import annotations

import fnmatch
import functools
import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any


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

# The credential files of the major ecosystems. By name, in any directory:
_BY_NAME: dict[str, tuple[str, Action]] = {
    ".git-credentials": ("git credentials", Action.SCRUB),
    ".npmrc": ("npm config", Action.SCRUB),
    ".yarnrc": ("yarn classic config", Action.SCRUB),
    ".yarnrc.yml": ("yarn config", Action.SCRUB),
    "pip.conf": ("pip config", Action.SCRUB),  # userinfo in index-url, extra-index-url…
    "pip.ini": ("pip config", Action.SCRUB),
    ".pypirc": ("PyPI config", Action.SCRUB),  # twine
    "poetry.toml": ("Poetry config", Action.SCRUB),  # http-basic.*.password, pypi-token.*
    "auth.toml": ("Poetry config", Action.SCRUB),
    "auth.json": ("Composer auth", Action.SCRUB),
    ".netrc": ("netrc", Action.SCRUB),
    "_netrc": ("netrc", Action.SCRUB),
    ".terraformrc": ("Terraform CLI config", Action.SCRUB),
    "terraform.rc": ("Terraform CLI config", Action.SCRUB),
    "kubeconfig": ("kubeconfig", Action.SCRUB),
    "kubeconfig.yaml": ("kubeconfig", Action.SCRUB),
    "kubeconfig.yml": ("kubeconfig", Action.SCRUB),
    ".my.cnf": ("MySQL client config", Action.SCRUB),
    "credentials.json": ("credentials file", Action.EMPTY),
    "application_default_credentials.json": ("gcloud credentials", Action.EMPTY),
    ".pgpass": ("PostgreSQL passwords", Action.EMPTY),
    ".vault-token": ("Vault token", Action.EMPTY),
}
# by parent directory and name (the file's own name says too little):
_BY_PARENT: dict[tuple[str, str], tuple[str, Action]] = {
    (".docker", "config.json"): ("Docker config", Action.SCRUB),
    (".cargo", "credentials"): ("cargo credentials", Action.EMPTY),
    (".cargo", "credentials.toml"): ("cargo credentials", Action.EMPTY),
    (".cargo", "config"): ("cargo config", Action.SCRUB),  # [registries.*] token
    (".cargo", "config.toml"): ("cargo config", Action.SCRUB),
    (".gem", "credentials"): ("RubyGems credentials", Action.EMPTY),
    (".bundle", "config"): ("Bundler config", Action.SCRUB),  # BUNDLE_HOST__NAME: user:pass
    (".kube", "config"): ("kubeconfig", Action.SCRUB),
    (".terraform.d", "credentials.tfrc.json"): ("Terraform credentials", Action.EMPTY),
    ("config", "master.key"): ("Rails master key", Action.EMPTY),
    ("gh", "hosts.yml"): ("GitHub CLI token", Action.EMPTY),
}
# directories, covered whole:
_DIRS: dict[str, str] = {".aws": "AWS credentials", ".azure": "Azure CLI credentials"}
_DIRS_BY_PARENT: dict[tuple[str, str], str] = {(".config", "gcloud"): "gcloud credentials"}


# A superset of the names rule_for covers, built from its tables: the exact names
# (any parent), and what its patterns test on the lower-cased name (.env.*, the key
# names' prefixes, the suffixes).
_EXACT = frozenset(
    {*_BY_NAME, *_DIRS, ".env", *(n for _, n in _BY_PARENT), *(n for _, n in _DIRS_BY_PARENT)}
)
_PATTERNS = re.compile(
    "^(?:" + "|".join(re.escape(p) for p in (".env.", *_KEY_NAMES)) + ")"
    r"|\.(?:kubeconfig|pem|key|p12|pfx)$",
    re.MULTILINE,
)


def any_candidate(names: Collection[str]) -> bool:
    """Whether any of NAMES (one directory's listing) could be something rule_for
    covers, in two steps done in C rather than a call per entry: the exact names by
    set intersection, the patterns by one search of the lower-cased listing (lower()
    maps characters one by one and a name holding a newline only adds lines, never
    hides one: a superset)."""
    if not _EXACT.isdisjoint(names):
        return True
    return _PATTERNS.search("\n".join(names).lower()) is not None


@functools.lru_cache(maxsize=1 << 16)
def rule_for(parent: str, name: str, is_dir: bool) -> Rule | None:
    """What covers the entry NAME of a directory whose own name is PARENT, if anything.
    Pure, and asked once per entry of every tree: a tree repeats its names (index.js,
    package.json), so the answers are kept (bounded; a Rule is frozen)."""
    lower = name.lower()
    if is_dir:
        kind = _DIRS.get(name) or _DIRS_BY_PARENT.get((parent, name))
        return Rule(kind, Action.EMPTY, is_dir=True) if kind else None
    row = _BY_PARENT.get((parent, name)) or _BY_NAME.get(name)
    if row is None and lower.endswith(".kubeconfig"):
        row = ("kubeconfig", Action.SCRUB)
    if row is not None:
        return Rule(row[0], row[1], needs_content=row[1] is Action.SCRUB)
    if name == ".env" or (name.startswith(".env.") and name[5:].lower() not in _ENV_KEEP):
        return Rule("environment file", Action.EMPTY)
    if lower.startswith(_KEY_NAMES) and not lower.endswith(".pub"):
        return Rule("private key", Action.EMPTY)
    if parent == "credentials" and lower.endswith(".key"):  # Rails config/credentials/*.key
        return Rule("Rails credentials key", Action.EMPTY)
    if lower.endswith((".pem", ".key")):
        return Rule("private key", Action.EMPTY, needs_content=True)
    if lower.endswith((".p12", ".pfx")):
        return Rule("PKCS#12 key store", Action.EMPTY)
    return None


USER_KIND = "secret (filesystem.secrets)"


def user_rule(patterns: Sequence[str], rel: str, is_dir: bool) -> Rule | None:
    """The profile's own patterns (``filesystem.secrets``), covered empty: a pattern
    without a ``/`` matches a name at any depth, one with a ``/`` the path from the
    tree's top (fnmatch: ``*`` crosses ``/`` there)."""
    name = rel.rpartition("/")[2]
    for pat in patterns:
        if fnmatch.fnmatchcase(rel if "/" in pat else name, pat.strip("/")):
            return Rule(USER_KIND, Action.EMPTY, is_dir=is_dir)
    return None


def holds_private_key(head: bytes) -> bool:
    """A PEM private key of any kind (RSA, EC, OPENSSH, ENCRYPTED, plain PKCS#8)."""
    return bool(re.search(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----", head))


# --- scrubbing -------------------------------------------------------------------------

# scheme://user[:password]@ — the userinfo of a URL, wherever it appears
_USERINFO = re.compile(rb"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s\"']+@")
_NPM_SECRET_KEYS = frozenset(
    {"_authtoken", "_auth", "_password", "password", "token", "certfile", "keyfile"}
)
_YARN_SECRET_KEYS = frozenset({"npmauthtoken", "npmauthident", "npmpassword"})
_PYPI_SECRET_KEYS = frozenset({"password", "token"})
_INI_KEY = re.compile(rb"^\s*([^=:\s]+)\s*[=:]")  # Python's configparser (.pypirc)
_NPM_KEY = re.compile(rb"^\s*([^=\s][^=]*?)\s*=")  # npm's ini: the key may hold ':'

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
    """yarn berry: ``npmAuthToken``/``npmAuthIdent``/``npmPassword``, top-level or in
    ``npmScopes``/``npmRegistries`` (a block value goes with its key)."""
    return scrub_yaml(data, _YARN_SECRET_KEYS)


_YARN1_KEY = re.compile(rb"""^\s*("(?:[^"\\]|\\.)*"|[^\s"#]+)""")


def scrub_yarnrc_classic(data: bytes) -> bytes:
    """yarn classic's ``.yarnrc`` (``key value`` lines, keys maybe quoted):
    ``"//registry.example/:_authToken" tok`` and the other npm auth keys."""
    out = []
    for line in _lines(data):
        m = _YARN1_KEY.match(line)
        key = m.group(1).strip(b'"').rsplit(b":", 1)[-1].lower().decode("latin-1") if m else ""
        if key not in _NPM_SECRET_KEYS:
            out.append(line)
    return _USERINFO.sub(rb"\1", b"".join(out))


_YAML_LINE = re.compile(rb"""^([ \t]*)(?:-[ \t]+)?["']?([A-Za-z0-9_-]+)["']?[ \t]*:(?:[ \t]|$)""")


def _indent(line: bytes) -> int:
    return len(line) - len(line.lstrip(b" \t"))


def scrub_yaml(data: bytes, secret: frozenset[str]) -> bytes:
    """A YAML file without the keys in SECRET (lower-cased), at any depth, each with
    the more-indented lines below it (a block scalar, a nested mapping); a JSON
    document (YAML's flow style: a kubeconfig may be JSON) is parsed and re-written.
    The userinfo of every URL left removed."""
    stripped = data.lstrip()
    if stripped[:1] in (b"{", b"["):
        try:
            return (json.dumps(_drop_json(json.loads(data), secret), indent=2) + "\n").encode()
        except ValueError:
            pass
    out, depth = [], -1  # depth: the indent of the key being dropped
    for line in _lines(data):
        if depth >= 0 and (not line.strip() or _indent(line) > depth):
            continue
        depth = -1
        m = _YAML_LINE.match(line)
        if m and m.group(2).lower().decode("latin-1") in secret:
            depth = len(m.group(1))
            continue
        out.append(line)
    return _USERINFO.sub(rb"\1", b"".join(out))


def _drop_json(doc: object, secret: frozenset[str]) -> object:
    if isinstance(doc, dict):
        return {k: _drop_json(v, secret) for k, v in doc.items() if str(k).lower() not in secret}
    if isinstance(doc, list):
        return [_drop_json(v, secret) for v in doc]
    return doc


_KUBE_SECRET_KEYS = frozenset(
    {
        "token",
        "client-key-data",
        "password",
        "access-token",
        "refresh-token",
        "id-token",
        "client-secret",
    }
)


def scrub_kubeconfig(data: bytes) -> bytes:
    """A user's ``token``, ``client-key-data``, ``password`` and the auth-provider's
    tokens removed; clusters, contexts and certificates kept."""
    return scrub_yaml(data, _KUBE_SECRET_KEYS)


_TOML_SECTION = re.compile(rb"^\s*\[+\s*([^\]]+?)\s*\]")
_TOML_KEY = re.compile(
    rb"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*="""
)
_TOML_SECRET = frozenset({"password", "token", "secret-key"})


def _toml_parts(key: bytes) -> list[str]:
    return [p.strip().strip(b"\"'").lower().decode("latin-1") for p in key.split(b".")]


def scrub_toml(data: bytes) -> bytes:
    """Poetry's ``poetry.toml``/``auth.toml`` (``http-basic.*.password``,
    ``pypi-token.*``) and cargo's config (``[registry] token``, ``[registries.*]
    token``, ``secret-key``): those keys removed, a multi-line string value whole."""
    out, section, closing = [], [""], b""
    for line in _lines(data):
        if closing:  # inside a dropped multi-line string
            if closing in line:
                closing = b""
            continue
        sect = _TOML_SECTION.match(line)
        if sect:
            section = _toml_parts(sect.group(1))
        key = _TOML_KEY.match(line) if not sect else None
        if key:
            parts = section + _toml_parts(key.group(1))
            if parts[-1] in _TOML_SECRET or any(p.startswith("pypi-token") for p in parts):
                value = line[key.end() :].strip()
                quote = value[:3]
                if quote in (b'"""', b"'''") and value.count(quote) < 2:
                    closing = quote
                continue
        out.append(line)
    return _USERINFO.sub(rb"\1", b"".join(out))


_COMPOSER_AUTH = frozenset(
    {
        "http-basic",
        "github-oauth",
        "gitlab-oauth",
        "gitlab-token",
        "bitbucket-oauth",
        "bearer",
        "forgejo-token",
        "custom-headers",
        "client-certificate",
    }
)


def _json_object(data: bytes) -> dict[str, Any] | None:
    """DATA as a JSON object, or None (not JSON, or JSON of another kind)."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def scrub_composer_auth(data: bytes) -> bytes:
    """Composer's ``auth.json``: every kind of credential it holds removed; a file that is
    not a JSON object becomes ``{}`` (it cannot be scrubbed)."""
    doc = _json_object(data)
    if doc is None:
        return b"{}\n"
    kept = {k: v for k, v in doc.items() if k not in _COMPOSER_AUTH}
    return data if kept == doc else (json.dumps(kept, indent=4) + "\n").encode()


_HCL_TOKEN = re.compile(rb"""\btoken\s*=\s*("(?:[^"\\]|\\.)*"|\S+)""")


def scrub_terraformrc(data: bytes) -> bytes:
    """``credentials "host" { token = "…" }``: the token emptied, the blocks kept."""
    return _HCL_TOKEN.sub(b'token = ""', data)


_BUNDLE_KEY = re.compile(rb"""^\s*["']?(BUNDLE_[A-Z0-9_]+)["']?\s*:""")
_BUNDLE_KEEP = (b"BUNDLE_MIRROR__", b"BUNDLE_BUILD__", b"BUNDLE_LOCAL__")


def scrub_bundler(data: bytes) -> bytes:
    """Bundler's ``.bundle/config``: a host's credentials are stored under the host's
    name (``BUNDLE_GEMS__EXAMPLE__COM: "user:pass"``); those go, mirrors, build
    options and local overrides stay."""
    out = []
    for line in _lines(data):
        m = _BUNDLE_KEY.match(line)
        if m and b"__" in m.group(1) and not m.group(1).startswith(_BUNDLE_KEEP):
            continue
        out.append(line)
    return _USERINFO.sub(rb"\1", b"".join(out))


def scrub_my_cnf(data: bytes) -> bytes:
    return _drop_keys(data, _INI_KEY, frozenset({"password"}))


def scrub_pypirc(data: bytes) -> bytes:
    return _drop_keys(data, _INI_KEY, _PYPI_SECRET_KEYS)


def scrub_netrc(data: bytes) -> bytes:
    return _NETRC_SECRET.sub(b"", data)


def scrub_urls(data: bytes) -> bytes:
    """``.git-credentials`` (one URL with its userinfo per line; what is left is
    harmless) and pip's config (a token in ``index-url``/``extra-index-url``)."""
    return _USERINFO.sub(rb"\1", data)


def scrub_docker_config(data: bytes) -> bytes:
    """``auths.*.auth``/``identitytoken``/``registrytoken``/``password`` removed; a file
    that is not JSON becomes ``{}`` (it cannot be scrubbed, so nothing of it is shown)."""
    doc = _json_object(data)
    if doc is None:
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
    "yarn classic config": scrub_yarnrc_classic,
    "pip config": scrub_urls,
    "Poetry config": scrub_toml,
    "cargo config": scrub_toml,
    "Composer auth": scrub_composer_auth,
    "Bundler config": scrub_bundler,
    "Terraform CLI config": scrub_terraformrc,
    "kubeconfig": scrub_kubeconfig,
    "MySQL client config": scrub_my_cnf,
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
