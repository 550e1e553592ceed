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
import math
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from enum import Enum
from json.encoder import encode_basestring_ascii
from typing import Any

from boxyd.config.projectregistries import ini_unsafe


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
    ".envrc": ("direnv environment", Action.EMPTY),  # its exports are the project's secrets
    "terraform.tfstate": ("Terraform state", Action.EMPTY),  # every resource's secrets
    "terraform.tfstate.backup": ("Terraform state", Action.EMPTY),
    ".dev.vars": ("Wrangler secrets", Action.EMPTY),
    ".s3cfg": ("s3cmd config", Action.EMPTY),
    "rclone.conf": ("rclone config", Action.EMPTY),
    ".sentryclirc": ("Sentry CLI token", Action.EMPTY),
    ".databrickscfg": ("Databricks config", Action.EMPTY),
    ".dockercfg": ("Docker credentials", Action.EMPTY),
    # Java properties: Gradle's (<repo>Password, signing.password, gradle.publish.key…),
    # Android's local.properties and the signing config its docs name keystore.properties
    "gradle.properties": ("Java properties", Action.SCRUB),
    "local.properties": ("Java properties", Action.SCRUB),
    "keystore.properties": ("Java properties", Action.SCRUB),
    "signing.properties": ("Java properties", Action.SCRUB),
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
    ("config", "secrets.yml"): ("Rails secrets", Action.EMPTY),
    ("gh", "hosts.yml"): ("GitHub CLI token", Action.EMPTY),
    (".kaggle", "kaggle.json"): ("Kaggle API token", Action.EMPTY),
    (".streamlit", "secrets.toml"): ("Streamlit secrets", Action.EMPTY),
    (".m2", "settings.xml"): ("Maven settings", Action.EMPTY),  # <server><password>
    (".m2", "settings-security.xml"): ("Maven master password", Action.EMPTY),
}
# a copy of a covered file, by the names editors and people give one: covered empty
BACKUP_SUFFIXES = (
    "~", ".bak", ".backup", ".old", ".orig", ".save", ".sav", ".copy", ".tmp", ".prev",
    ".swp", ".swo", "-backup", "-bak", "-old", "-copy", "_backup", "_old", ".1", ".2",
)  # fmt: skip
# directories, covered whole:
_DIRS: dict[str, str] = {
    ".aws": "AWS credentials",
    ".azure": "Azure CLI credentials",
    ".envs": "environment files",  # cookiecutter-django's .envs/.production/.django
}
_DIRS_BY_PARENT: dict[tuple[str, str], str] = {(".config", "gcloud"): "gcloud credentials"}


# A superset of the names rule_for covers, built from its tables: the exact names
# (any parent), and what its patterns test on the lower-cased name (.env.*, the key
# names' prefixes, the suffixes).
_EXACT = frozenset(
    {*_BY_NAME, *_DIRS, ".env", *(n for _, n in _BY_PARENT), *(n for _, n in _DIRS_BY_PARENT)}
)
_PATTERNS = re.compile(
    "^(?:" + "|".join(re.escape(p) for p in (".env", *_KEY_NAMES)) + ")"
    r"|\.(?:kubeconfig|pem|key|p8|pk8|p12|pfx|jks|keystore|env|tfvars|tfvars\.json)$"
    "|(?:" + "|".join(re.escape(b) for b in BACKUP_SUFFIXES) + r")$|^#.*#$|\.sw[a-z]$",
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
    """What covers the entry NAME of a directory whose own name is PARENT, if anything:
    by its own name (_by_name), or as a copy of a covered file (`.npmrc.bak`,
    `.env~`, `#.pgpass#`: covered empty, whatever the original's rule). Pure, and
    asked once per entry of every tree: a tree repeats its names (index.js,
    package.json), so the answers are kept (bounded; a Rule is frozen)."""
    rule = _by_name(parent, name, is_dir)
    if rule is not None or is_dir:
        return rule
    for base in _copied(name):
        original = _by_name(parent, base, False)
        if original is not None:
            return Rule(f"copy of a {original.kind}", Action.EMPTY)
    return None


def _copied(name: str) -> list[str]:
    """The names NAME may be a copy of, by the usual backup names."""
    out = []
    if len(name) > 2 and name[0] == name[-1] == "#":
        out.append(name[1:-1])  # Emacs' auto-save
    if len(name) > 5 and name[0] == "." and name[-4:-1] == ".sw" and name[-1].isalpha():
        out += [name[1:-4], name[:-4]]  # Vim's swap: .X.swp (.swo, .swn …) for X or .X
    out += [name[: -len(s)] for s in BACKUP_SUFFIXES if name.endswith(s) and len(name) > len(s)]
    return out


def _by_name(parent: str, name: str, is_dir: bool) -> Rule | None:
    lower = name.lower()
    if is_dir:
        kind = _DIRS.get(name) or _DIRS_BY_PARENT.get((parent, name))
        return Rule(kind, Action.EMPTY, is_dir=True) if kind else None
    row = _BY_PARENT.get((parent, name)) or _BY_NAME.get(name)
    if row is None and lower.endswith(".kubeconfig"):
        row = ("kubeconfig", Action.SCRUB)
    if row is not None:
        return Rule(row[0], row[1], needs_content=row[1] is Action.SCRUB)
    if _env_file(lower):
        return Rule("environment file", Action.EMPTY)
    if lower.endswith((".tfvars", ".tfvars.json")):
        return Rule("Terraform variables", Action.EMPTY)
    if lower.startswith(_KEY_NAMES) and not lower.endswith(".pub"):
        return Rule("private key", Action.EMPTY)
    if parent == "credentials" and lower.endswith(".key"):  # Rails config/credentials/*.key
        return Rule("Rails credentials key", Action.EMPTY)
    if lower.endswith((".pem", ".key", ".p8", ".pk8")):
        return Rule("private key", Action.EMPTY, needs_content=True)
    if lower.endswith((".p12", ".pfx")):
        return Rule("PKCS#12 key store", Action.EMPTY)
    if lower.endswith((".jks", ".keystore")):
        return Rule("Java key store", Action.EMPTY)
    return None


def _env_file(lower: str) -> bool:
    """.env, .env.local, .env-backup, .env~, prod.env: not an example of one
    (.env.example, .env-sample, example.env, .env.dist …)."""
    if lower == ".env":
        return True
    if lower.startswith(".env") and lower[4] in ".-_~":
        return lower[5:] not in _ENV_KEEP
    if lower.endswith(".env") and len(lower) > 4:
        return lower[:-4].strip(".-_") not in _ENV_KEEP
    return False


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


# A key under an ordinary name (deploy_key, prod-sa.json, key.txt, a VPN or WireGuard
# config, a Kubernetes Secret's YAML) is found by what it holds: the first
# CONTENT_PROBE bytes of each file whose name says nothing (no extension) or could be
# one (.txt, .json, .asc, .gpg, .ppk, .conf, .yaml …) are searched, in C — as many as a
# .pem's (a bundle puts its certificates first).
CONTENT_PROBE = KEY_PROBE
_PROBED_SUFFIXES = (
    ".txt", ".json", ".asc", ".gpg", ".pgp", ".ppk", ".priv", ".cred", ".secret", ".sa",
    ".ovpn", ".conf", ".cfg", ".ini", ".yaml", ".yml", ".toml", ".age", ".bak",
)  # fmt: skip


def probe_worthy(name: str) -> bool:
    """The file NAME is looked into for a key (by_content): no extension, or one a
    key file is given."""
    lower = name.lower()
    return "." not in lower[1:] or lower.endswith(_PROBED_SUFFIXES)


def by_content(head: bytes) -> str | None:
    """What kind of key HEAD (a file's first bytes) is, whatever its name: a PEM private
    key (OpenSSH's too, or base64 again as a Kubernetes Secret holds one), a PGP secret
    key (armoured or binary), a PuTTY key, an age identity, a WireGuard private key, a
    cloud service account's JSON (Google's: its type and private_key); or None."""
    if holds_private_key(head) or _base64_pem(head):
        return "private key"
    if b"-----BEGIN PGP PRIVATE KEY BLOCK-----" in head or _pgp_secret_packet(head):
        return "PGP private key"
    if head.startswith(b"PuTTY-User-Key-File-"):
        return "PuTTY private key"
    if b"AGE-SECRET-KEY-1" in head:
        return "age secret key"
    if b"[Interface]" in head and _WG_KEY.search(head):
        return "WireGuard private key"
    if b'"service_account"' in head and b'"private_key"' in head:
        return "cloud service account key"
    return None


_WG_KEY = re.compile(rb"(?im)^[ \t]*PrivateKey[ \t]*=")
_B64_BEGIN = b"LS0tLS1CRUdJTi"  # "-----BEGIN" in base64, from a 3-byte boundary
_B64_MAX = 16  # occurrences looked at: a file of nothing else costs no more


def _base64_pem(head: bytes) -> bool:
    """A PEM private key base64-encoded again (a Secret's ``tls.key``, a kubeconfig's
    ``client-key-data`` under another name): its first bytes decoded."""
    import base64
    import binascii

    at = head.find(_B64_BEGIN)
    for _ in range(_B64_MAX):
        if at < 0:
            return False
        chunk = head[at : at + 64]
        try:
            if holds_private_key(base64.b64decode(chunk[: len(chunk) // 4 * 4])):
                return True
        except (binascii.Error, ValueError):
            pass
        at = head.find(_B64_BEGIN, at + 1)
    return False


def _pgp_secret_packet(head: bytes) -> bool:
    """A binary OpenPGP secret key (``gpg --export-secret-keys``, RFC 9580): a first
    packet of tag 5 or 7 (old or new format) whose body starts as a key's does —
    version 3 to 6, then (from v4) four bytes of time and a public-key algorithm."""
    if len(head) < 8:
        return False
    first = head[0]
    if first & 0xC0 == 0xC0:  # new format: tag in the low 6 bits, then a length
        tag, length_at = first & 0x3F, 1
        size = 1 if head[1] < 192 else 2 if head[1] < 224 else 5
    elif first & 0xC0 == 0x80:  # old format: tag in bits 5-2, length type in 1-0
        tag, length_at = (first >> 2) & 0x0F, 1
        size = (1, 2, 4, 0)[first & 0x03]
    else:
        return False
    body = length_at + size
    if tag not in (5, 7) or len(head) < body + 6:
        return False
    version = head[body]
    if version == 3:
        return True
    return version in (4, 5, 6) and head[body + 5] in _PGP_ALGORITHMS


_PGP_ALGORITHMS = frozenset((1, 2, 3, 16, 17, 18, 19, 20, 22, 25, 26, 27, 28))


# --- scrubbing -------------------------------------------------------------------------
#
# Every scrubber reads bytes a hostile program may have written, so each runs in time
# linear in its input (tests/unit/test_credentials_linear.py): a regex here is matched
# at a line's start in time linear in the line, or, searched through a file, its
# attempts read spans that do not overlap; nested input is walked with a stack of its
# own, never by recursion. Possessive quantifiers go on single characters only: on a
# group they matched where the greedy one did not before Python 3.11.5 (gh-106052).

# scheme://user[:password]@ — the userinfo of a URL, wherever it appears. An attempt
# starts only where a run of scheme characters does (the lookbehind), not at each
# letter of the run (quadratic in a long run without "://"); the scheme still starts
# at the run's first letter, and the digits and "+.-" before it are kept in \1.
_USERINFO = re.compile(
    rb"(?<![A-Za-z0-9+.-])([0-9+.-]*+[A-Za-z][A-Za-z0-9+.-]*+://)"  # \1: kept
    rb"[^/@\s\"']++@"
)
_NPM_SECRET_KEYS = frozenset(
    {"_authtoken", "_auth", "_password", "password", "token", "certfile", "keyfile"}
)
_YARN_SECRET_KEYS = frozenset({"npmauthtoken", "npmauthident", "npmpassword"})
_PYPI_SECRET_KEYS = frozenset({"password", "token"})
_INI_KEY = re.compile(rb"^\s*([^=:\s]+)\s*[=:]")  # Python's configparser (.pypirc)

_NETRC_SECRET = re.compile(rb"\b(password|account)\s+\S+")
_GIT_SECTION = re.compile(rb"^\s*\[\s*([A-Za-z0-9.-]+)")
_GIT_KEY = re.compile(rb"^\s*([A-Za-z][A-Za-z0-9-]*)\s*(=|$)")


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def _npm_key(line: bytes) -> bytes | None:
    """npm's ini key (it may hold ':'): what precedes the line's first '=', blanks
    around it stripped; None if there is no '=' after a first non-blank."""
    text = line.lstrip()
    eq = text.find(b"=")
    return text[:eq].rstrip() if eq > 0 else None


def _npm_name(line: bytes) -> bytes | None:
    """The key npm reads (its `ini` package decodes a key as it decodes a value: a
    quoted one is unquoted, JSON escapes and all; `"//r/:_authToken"=…` is the token
    npm sends), for the secret-key match."""
    raw = _npm_key(line)
    if raw is None:
        return None
    name, _ = ini_unsafe(raw.decode("utf-8", "replace"))
    key = name.encode("utf-8", "replace") if name is not None else raw
    return key[:-2] if key.endswith(b"[]") else key  # ini: `key[]=` is the array `key`


def _ini_key(line: bytes) -> bytes | None:
    m = _INI_KEY.match(line)
    return m.group(1) if m else None


def _drop_keys(data: bytes, key: Callable[[bytes], bytes | None], secret: frozenset[str]) -> bytes:
    """Every line whose key (KEY(line), lower-cased, after its last ':') is in SECRET
    dropped; the userinfo of every URL left removed."""
    out = []
    for line in _lines(data):
        name = key(line)
        if not (name and name.rsplit(b":", 1)[-1].lower().decode("latin-1") in secret):
            out.append(line)
    return _USERINFO.sub(rb"\1", b"".join(out))


_ENV_REFERENCE = re.compile(rb"\$\{[A-Za-z_][A-Za-z0-9_]*\??\}")


def npm_env_reference(line: bytes) -> bool:
    """A line whose whole value is npm's reference to the environment (``${NAME}``,
    ``${NAME?}``): it holds no secret, and npm needs it to send the token the run
    passed (--secret NAME, a placeholder for NAME@HOST)."""
    eq = line.find(b"=")
    return eq > 0 and _ENV_REFERENCE.fullmatch(line[eq + 1 :].strip()) is not None


def _npm_secret_name(line: bytes) -> bytes | None:
    return None if npm_env_reference(line) else _npm_name(line)


def scrub_npmrc(data: bytes) -> bytes:
    """Drop ``_authToken``, ``_auth``, ``_password``… — also scoped, as npm writes them
    (``//registry.example/:_authToken=…``); keep the registry settings, and a token
    given as a reference to the environment (npm_env_reference)."""
    return _drop_keys(data, _npm_secret_name, _NPM_SECRET_KEYS)


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


_UNPARSED = object()  # what _json_load returns for bytes that are no JSON it can read


def _json_load(data: bytes) -> object:
    """DATA parsed as JSON, or _UNPARSED: not JSON, or nested deeper than the parser
    (C, one level of the interpreter's recursion limit per level) can go."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return _UNPARSED


def scrub_yaml(data: bytes, secret: frozenset[str]) -> bytes:
    """A YAML file without the keys in SECRET (lower-cased), at any depth, each with
    the more-indented lines below it (a block scalar, a nested mapping); a JSON
    document (YAML's flow style: a kubeconfig may be JSON) is parsed and re-written.
    The userinfo of every URL left removed."""
    stripped = data.lstrip()
    if stripped[:1] in (b"{", b"["):
        doc = _json_load(data)
        if doc is not _UNPARSED:  # JSON too deep to parse is read as lines, as bad JSON is
            return (_json_dumps(_drop_json(doc, secret), "  ") + "\n").encode()
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
    return _no_flow_secret(_USERINFO.sub(rb"\1", b"".join(out)), secret)


# A key inside a flow mapping (YAML's `user: {token: x}`, TOML's inline table
# `corp = { index = "…", token = "x" }`), which the line scrubbers do not take apart.
# Each attempt starts at a '{' or ',' and reads the name after it: the names read by
# two attempts do not overlap (linear).
_FLOW_KEY = re.compile(rb"""[{,][ \t]*+["']?([A-Za-z0-9_.-]++)["']?[ \t]*+[:=]""")


def _no_flow_secret(data: bytes, secret: frozenset[str]) -> bytes:
    """DATA, or nothing of it (covered empty) when a key of SECRET is left inside a
    flow mapping: one line holds several keys, so no line can go alone."""
    for m in _FLOW_KEY.finditer(data):
        key = m.group(1).rsplit(b".", 1)[-1].lower().decode("latin-1")
        if key in secret or key.startswith("pypi-token"):
            return b""
    return data


def _json_shell(value: object, work: list[tuple[object, object]]) -> object:
    """An empty container of VALUE's kind, queued on WORK to be filled from VALUE;
    VALUE itself if it is no container."""
    shell: object = {} if isinstance(value, dict) else [] if isinstance(value, list) else value
    if shell is not value:
        work.append((value, shell))
    return shell


def _drop_json(doc: object, secret: frozenset[str]) -> object:
    """A copy of DOC without the keys in SECRET at any depth. Walked with a stack of
    its own: a document the parser took may nest deeper than Python's recursion."""
    work: list[tuple[object, object]] = []
    top = _json_shell(doc, work)
    while work:
        old, new = work.pop()
        if isinstance(old, dict) and isinstance(new, dict):
            for k, v in old.items():
                if str(k).lower() not in secret:
                    new[k] = _json_shell(v, work)
        elif isinstance(old, list) and isinstance(new, list):
            new.extend(_json_shell(v, work) for v in old)
    return top


def _json_scalar(value: object) -> str:
    """json.dumps of what json.loads makes of a JSON scalar."""
    if isinstance(value, str):
        return encode_basestring_ascii(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (math.inf, -math.inf):
            return "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def _json_dumps(doc: object, indent: str) -> str:
    """``json.dumps(DOC, indent=INDENT)`` for what json.loads returns, byte for byte;
    json's own encoder recurses once per level (the scrubbers' documents come from the
    payload: a depth the parser took could still overflow it)."""
    out: list[str] = []
    work: list[str | tuple[object, int]] = [(doc, 0)]  # text to write, or (value, level)
    while work:
        item = work.pop()
        if isinstance(item, str):
            out.append(item)
            continue
        value, level = item
        if not isinstance(value, (dict, list)):
            out.append(_json_scalar(value))
            continue
        if not value:
            out.append("{}" if isinstance(value, dict) else "[]")
            continue
        inner = "\n" + indent * (level + 1)
        if isinstance(value, dict):
            entries = [(_json_key(k) + ": ", v) for k, v in value.items()]
            brackets = "{}"
        else:
            entries = [("", v) for v in value]
            brackets = "[]"
        todo: list[str | tuple[object, int]] = []
        for i, (key, v) in enumerate(entries):
            todo += [(brackets[0] if i == 0 else ",") + inner + key, (v, level + 1)]
        todo.append("\n" + indent * level + brackets[1])
        work.extend(reversed(todo))
    return "".join(out)


def _json_key(key: object) -> str:
    if not isinstance(key, str):  # json.loads makes none: json.dumps would convert it
        raise TypeError(f"not a JSON key: {key!r}")
    return encode_basestring_ascii(key)


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


_TOML_KEY = re.compile(
    rb"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*="""
)
_TOML_SECRET = frozenset({"password", "token", "secret-key"})


def _toml_section(line: bytes) -> bytes | None:
    """The name of the section a header line opens (``[a.b]``, ``[[a]]``): what the
    regex ``^\\s*\\[+\\s*([^\\]]+?)\\s*\\]`` takes for its group, which backtracking
    made cubic in a line of '[' and blanks. Everything before the line's first ']'
    is brackets, blanks and the name, so the name is what is left once stripped; with
    nothing left, the regex gave back one blank, or else one '['."""
    text = line.lstrip()
    close = text.find(b"]")
    if not text.startswith(b"[") or close < 0:
        return None
    inside = text[:close]
    rest = inside.lstrip(b"[")
    if rest.strip():
        return rest.strip()
    if rest:
        return rest[-1:]
    return b"[" if len(inside) > 1 else None


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
        sect = _toml_section(line)
        if sect is not None:
            section = _toml_parts(sect)
        key = _TOML_KEY.match(line) if sect is None else None
        if key:
            parts = section + _toml_parts(key.group(1))
            if parts[-1] in _TOML_SECRET or any(p.startswith("pypi-token") for p in parts):
                value = line[key.end() :].strip()
                quote = value[:3]
                if quote in (b'"""', b"'''") and value.count(quote) < 2:
                    closing = quote
                continue
        out.append(line)
    return _no_flow_secret(_USERINFO.sub(rb"\1", b"".join(out)), _TOML_SECRET)


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
    doc = _json_load(data)
    return doc if isinstance(doc, dict) else None


def scrub_composer_auth(data: bytes) -> bytes:
    """Composer's ``auth.json``: every kind of credential it holds removed; a file that is
    not a JSON object becomes ``{}`` (it cannot be scrubbed)."""
    doc = _json_object(data)
    if doc is None:
        return b"{}\n"
    kept = {k: v for k, v in doc.items() if k not in _COMPOSER_AUTH}
    return data if kept == doc else (_json_dumps(kept, "    ") + "\n").encode()


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
    return _drop_keys(data, _ini_key, frozenset({"password"}))


def scrub_pypirc(data: bytes) -> bytes:
    return _drop_keys(data, _ini_key, _PYPI_SECRET_KEYS)


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
    return (_json_dumps(doc, "\t") + "\n").encode()


def scrub_git_config(data: bytes) -> bytes:
    """git's config without ``http.*.extraheader`` (a CI checkout's token),
    ``credential.*.username`` and ``sendemail.smtpPass``, and with the userinfo removed
    from every URL — in
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


# A key of Java's properties that may hold a secret, after Properties.load's decoding
# (Gradle's credentials(): <name>Password, <name>SecretKey, <name>SessionToken,
# <name>AuthHeaderValue; signing.password, signingInMemoryKey, gradle.publish.key;
# Android's storePassword/keyPassword): dropped on the side of caution.
_JAVA_SECRET = re.compile(r"pass|pwd|secret|token|credential|auth|key$|privatekey|apikey")
_JAVA_BLANK = b" \t\f"
_JAVA_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _java_logical(data: bytes) -> list[list[bytes]]:
    """DATA's logical lines as Properties.load reads them, each a list of its natural
    lines (\n, \r, \r\n): a line ending in an odd number of backslashes goes on,
    unless it is a comment (# or ! first)."""
    out: list[list[bytes]] = []
    going = False
    for line in _lines(data):
        if going:
            out[-1].append(line)
        else:
            out.append([line])
        body = line.rstrip(b"\r\n")
        comment = not going and body.lstrip(_JAVA_BLANK)[:1] in (b"#", b"!")
        going = not comment and (len(body) - len(body.rstrip(b"\\"))) % 2 == 1
    return out


def _java_key(natural: list[bytes]) -> str:
    """The key of one logical line, decoded as Java does (\\uXXXX, \\t…, \\X is X;
    ends at an unescaped '=', ':' or blank); the continuation lines' leading blanks go."""
    parts = [n.lstrip(_JAVA_BLANK).rstrip(b"\r\n") for n in natural]
    # each line but the last ends in the backslash that continued it
    text = b"".join([p[:-1] for p in parts[:-1]] + parts[-1:]).decode("latin-1")
    key: list[str] = []
    i = 0
    while i < len(text) and text[i] not in "=: \t\f":
        if text[i] == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and i + 6 <= len(text):
                try:
                    key.append(chr(int(text[i + 2 : i + 6], 16)))
                except ValueError:
                    key.append(text[i + 2 : i + 6])  # Java refuses the file: kept as is
                i += 6
                continue
            key.append(_JAVA_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        key.append(text[i])
        i += 1
    return "".join(key)


def scrub_java_properties(data: bytes) -> bytes:
    """``gradle.properties`` and the like without the keys _JAVA_SECRET names, each
    logical line whole (its continuations with it), and no URL's userinfo."""
    out = []
    for natural in _java_logical(data):
        if not _JAVA_SECRET.search(_java_key(natural).lower()):
            out.extend(natural)
    return _USERINFO.sub(rb"\1", b"".join(out))


# git's keys that hold a secret (git-config(1)): a CI checkout's header, a credential's,
# git send-email's SMTP password (a proxy's is a URL's userinfo: scrubbed as URLs are)
_GIT_SECRETS = {
    b"http": (b"extraheader",),
    b"credential": (b"username", b"password", b"helper"),  # a helper may be `!echo …`
    b"sendemail": (b"smtppass",),
}


def _git_secret(section: bytes, key: bytes) -> bool:
    return key in _GIT_SECRETS.get(section, ())


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
    "Java properties": scrub_java_properties,
}

GIT_CONFIG = Rule("git config", Action.SCRUB, needs_content=True)


def scrub(rule: Rule, data: bytes) -> bytes:
    """The stand-in's content for a SCRUB rule."""
    return _SCRUBBERS[rule.kind](data)
