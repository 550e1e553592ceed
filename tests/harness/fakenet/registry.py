"""A tiny package registry and git host on the public servers, for real clients
sending a token (`--secret NAME@HOST`: tests/escape/test_secret_clients.py). Each
serves one package, and only to a request carrying plan.REGISTRY_TOKEN as npm, pip and
git send it (`Bearer TOKEN`, or Basic with TOKEN for the password); any other request
gets a 401 with a Basic challenge, which is what makes git send its credentials.

  /npm/boxy-secret-pkg                            npm packument (JSON)
  /npm/boxy-secret-pkg/-/boxy-secret-pkg-1.0.0.tgz  its tarball
  /simple/boxy-secret-pkg/                        PEP 503 simple index page
  /packages/boxy_secret_pkg-1.0-py3-none-any.whl  its wheel
  /repo.git/...                                   a bare repository, dumb HTTP
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
import zipfile
import zlib
from functools import cache

from . import plan

PREFIXES = ("/npm/", "/simple/", "/packages/", "/repo.git/")
NAME, VERSION = "boxy-secret-pkg", "1.0.0"
WHEEL = "boxy_secret_pkg-1.0-py3-none-any.whl"
README = b"hello from boxy's test git host\n"
# (code, content type, body, extra headers)
Reply = tuple[int, str, bytes, dict[str, str]]


def authorized(header: str | None) -> bool:
    """HEADER is the token as a client sends it: Bearer, or Basic's password."""
    scheme, _, cred = (header or "").strip().partition(" ")
    if scheme.lower() == "bearer":
        return cred.strip() == plan.REGISTRY_TOKEN
    if scheme.lower() != "basic":
        return False
    try:
        user_pass = base64.b64decode(cred.strip(), validate=True).decode()
    except ValueError:
        return False
    return user_pass.partition(":")[2] == plan.REGISTRY_TOKEN


def reply(path: str, authorization: str | None) -> Reply | None:
    """The answer to a GET of PATH (no query), or None: not the registry's."""
    if not path.startswith(PREFIXES):
        return None
    if not authorized(authorization):
        challenge = {"WWW-Authenticate": 'Basic realm="boxy test registry"'}
        return 401, "text/plain", b"credentials required\n", challenge
    found = _files().get(path)
    if found is None:
        return 404, "text/plain", b"not found\n", {}
    return 200, found[0], found[1], {}


@cache
def _files() -> dict[str, tuple[str, bytes]]:
    """Path -> (content type, body)."""
    tgz, whl = _tarball(), _wheel()
    tgz_path = f"/npm/{NAME}/-/{NAME}-{VERSION}.tgz"
    www = plan.fqdn("www")
    dist = {
        "tarball": f"https://{www}{tgz_path}",
        "shasum": hashlib.sha1(tgz).hexdigest(),
        "integrity": "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode(),
    }
    packument = {
        "name": NAME,
        "dist-tags": {"latest": VERSION},
        "versions": {VERSION: {"name": NAME, "version": VERSION, "dist": dist}},
    }
    sha = hashlib.sha256(whl).hexdigest()
    index = f'<html><body><a href="/packages/{WHEEL}#sha256={sha}">{WHEEL}</a></body></html>\n'
    octets = "application/octet-stream"
    return {
        f"/npm/{NAME}": ("application/json", json.dumps(packument).encode()),
        tgz_path: (octets, tgz),
        f"/simple/{NAME}/": ("text/html", index.encode()),
        f"/packages/{WHEEL}": (octets, whl),
        **{path: (octets, body) for path, body in _repo().items()},
    }


def _tarball() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in (
            ("package/package.json", json.dumps({"name": NAME, "version": VERSION}).encode()),
            ("package/index.js", b"module.exports = 'boxy';\n"),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def _wheel() -> bytes:
    info = "boxy_secret_pkg-1.0.dist-info"
    files = {
        "boxy_secret_pkg/__init__.py": b"NAME = 'boxy'\n",
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: boxy-secret-pkg\nVersion: 1.0\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: boxy-test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = "".join(f"{name},sha256={_b64(data)},{len(data)}\n" for name, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w") as z:
        for name, data in files.items():
            z.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data)
    return raw.getvalue()


def _b64(data: bytes) -> str:
    """A wheel RECORD's hash: urlsafe base64 of the SHA-256, unpadded."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


def _repo() -> dict[str, bytes]:
    """A bare repository of one commit, as a dumb-HTTP server's files: info/refs,
    HEAD and each object loose (zlib'd, named by its SHA-1)."""
    objects: dict[str, bytes] = {}

    def put(kind: bytes, content: bytes) -> bytes:
        obj = kind + b" %d\0" % len(content) + content
        sha = hashlib.sha1(obj).hexdigest()
        objects[f"/repo.git/objects/{sha[:2]}/{sha[2:]}"] = zlib.compress(obj)
        return sha.encode()

    blob = put(b"blob", README)
    tree = put(b"tree", b"100644 README\0" + bytes.fromhex(blob.decode()))
    who = b"boxy <boxy@boxy.test> 0 +0000"
    commit = put(b"commit", b"tree " + tree + b"\nauthor " + who + b"\ncommitter " + who
                 + b"\n\nboxy test repository\n")  # fmt: skip
    return {
        "/repo.git/info/refs": commit + b"\trefs/heads/main\n",
        "/repo.git/HEAD": b"ref: refs/heads/main\n",
        **objects,
    }
