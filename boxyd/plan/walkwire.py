"""The walk before a run, as data between the walk process and boxyd (pure).

A ``worktree.Tree`` goes from the walk process (boxyd/daemon/walkproc.py) to the daemon as
JSON: plain values only, bytes as base64, tuples back as tuples (a fingerprint is
compared with ``==``). What comes back is boxyd's own child's work; it is still
decoded field by field into the typed values, never executed.
"""

from __future__ import annotations

import base64
from typing import Any

from boxyd.gitguard.discover import Protection
from boxyd.gitguard.scan import Record, Snapshot
from boxyd.plan.credentials import Action
from boxyd.plan.heldfiles import Kind, Present
from boxyd.plan.masking import Found
from boxyd.plan.worktree import Tree


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: Any) -> bytes | None:
    return None if text is None else base64.b64decode(str(text))


def encode_snapshot(snap: Snapshot) -> dict[str, Any]:
    return {
        "root": snap.root,
        "unreadable": sorted(snap.unreadable),
        "records": {
            rel: [r.role, r.type, list(r.fingerprint), list(r.keys), _b64(r.content)]
            for rel, r in snap.records.items()
        },
    }


def decode_snapshot(snap: dict[str, Any]) -> Snapshot:
    """Raises as decode() does."""
    return Snapshot(
        str(snap["root"]),
        {
            str(rel): Record(r[0], r[1], tuple(r[2]), tuple(str(k) for k in r[3]), _unb64(r[4]))
            for rel, r in snap["records"].items()
        },
        frozenset(str(u) for u in snap["unreadable"]),
    )


def encode(tree: Tree) -> dict[str, Any]:
    snap = tree.baseline
    return {
        "protections": [[p.rel, p.kind, p.is_dir, p.symlink] for p in tree.protections],
        "baseline": None if snap is None else encode_snapshot(snap),
        "credentials": [
            [f.rel, f.kind, f.action.value, f.is_dir, _b64(f.content), f.via, f.note]
            for f in tree.credentials
        ],
        "tools": {k: list(v) for k, v in tree.tools.items()},
        "dirs": list(tree.dirs),
        "unlisted": list(tree.unlisted),
        "stamps": [[rel, *st] for rel, st in tree.stamps.items()],
        "held": encode_held(tree.held),
        "gitdirs": list(tree.gitdirs),
        "hookdirs": list(tree.hookdirs),
    }


def decode(data: dict[str, Any]) -> Tree:
    """Raises KeyError, IndexError, TypeError, ValueError or AttributeError on anything
    malformed."""
    snap = data["baseline"]
    baseline = None if snap is None else decode_snapshot(snap)
    return Tree(
        protections=[
            Protection(str(p[0]), p[1], bool(p[2]), bool(p[3])) for p in data["protections"]
        ],
        baseline=baseline,
        credentials=[
            Found(
                str(f[0]),
                str(f[1]),
                Action(f[2]),
                bool(f[3]),
                _unb64(f[4]) or b"",
                str(f[5]),
                str(f[6]),
            )
            for f in data["credentials"]
        ],
        tools=decode_tools(data["tools"]),
        dirs=tuple(str(d) for d in data["dirs"]),
        unlisted=tuple(str(d) for d in data["unlisted"]),
        stamps={str(s[0]): (int(s[1]), int(s[2]), int(s[3])) for s in data["stamps"]},
        held=decode_held(data["held"]),
        gitdirs=tuple(str(g) for g in data["gitdirs"]),
        hookdirs=tuple(str(g) for g in data["hookdirs"]),
    )


def encode_held(held: dict[str, Present]) -> list[list[str]]:
    return [[p.rel, p.type, p.target, p.via, p.resolved] for p in held.values()]


def decode_held(data: Any) -> dict[str, Present]:
    """A Tree's held entries (heldfiles.Finder.found); raises as decode() does."""
    return {
        str(h[0]): Present(str(h[0]), _kind(h[1]), str(h[2]), str(h[3]), str(h[4])) for h in data
    }


def _kind(value: object) -> Kind:
    if value not in ("file", "dir", "symlink", "other", "absent"):
        raise ValueError(f"not an entry type: {value!r}")
    return value


def decode_tools(tools: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """A Tree's tools (execfiles.Watch.seen); raises as decode() does."""
    return {str(k): (str(v[0]), str(v[1])) for k, v in tools.items()}
