"""SHA-256 of small inputs (a config file, a project's settings, a git control file,
the scripts an IDE runs) from CPython's own implementation, not hashlib's: hashlib
maps OpenSSL's libcrypto into the process, 3.8 MiB of boxyd's resident memory
(issue #18: boxyd within 40 MB with 200 sessions) for hashes of a few KiB, where the
builtin takes microseconds. The digests are the same. A file that may be large
(up to GiB) still goes through hashlib, imported where it is hashed."""

from __future__ import annotations

import importlib
from typing import Protocol, cast


class Hash(Protocol):
    def update(self, data: bytes, /) -> None: ...
    def hexdigest(self) -> str: ...


class New(Protocol):
    def __call__(self, data: bytes = b"", /) -> Hash: ...


def _builtin() -> New:
    for name in ("_sha256", "_sha2"):  # Python 3.12 renamed the module
        try:
            return cast(New, importlib.import_module(name).sha256)
        except (ImportError, AttributeError):
            pass
    import hashlib  # a build without them

    return cast(New, hashlib.sha256)


sha256 = _builtin()
