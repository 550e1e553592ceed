"""A build id shared by client and daemon: a daemon started from other code is refused.

Computed from the installed sources' names, sizes and modification times (one stat
per source, about 140: a millisecond), so an edited checkout counts as a new build.
It tells builds apart, it guards nothing: two CRCs (64 bits) do, and zlib costs the
client a millisecond where hashlib (OpenSSL) costs four.
"""

from __future__ import annotations

import os
import zlib

_PACKAGES = ("boxy", "boxyd", "boxyctl")
_SUFFIXES = (".py", ".yaml", ".varlink")


_ID: list[str] = []  # computed once (functools would import collections on every start)


def build_id() -> str:
    if _ID:
        return _ID[0]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    listing: list[str] = []
    for pkg in _PACKAGES:
        _list(here, pkg, listing)
    data = "".join(listing).encode()
    _ID.append(f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}")
    return _ID[0]


def _list(here: str, rel: str, listing: list[str]) -> None:
    """REL's sources and then its subdirectories', in name order, as os.walk would
    give them (no symlinked directory followed, an unreadable one passed over); one
    scandir per directory and no path made relative again: this runs on every start."""
    try:
        with os.scandir(os.path.join(here, rel)) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return
    subdirs = []
    for entry in entries:
        if entry.is_dir():
            if not entry.is_symlink() and entry.name != "__pycache__":
                subdirs.append(entry.name)
        elif entry.name.endswith(_SUFFIXES):
            st = entry.stat()
            listing.append(f"{rel}/{entry.name}\0{st.st_size}\0{st.st_mtime_ns}\n")
    for name in subdirs:
        _list(here, f"{rel}/{name}", listing)
