"""Small path and list helpers the steps of build_spec share. Pure."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def contains(tree: str, path: str) -> bool:
    """PATH is TREE or lies beneath it, compared as spelled."""
    # "/".rstrip("/") + "/" is "/": the root contains every absolute path
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def absolute(path: str, base: str) -> str:
    """PATH against BASE (the client's cwd), normalised; not realpath'd."""
    return os.path.normpath(os.path.join(base, path))


def dedupe(items: Iterable[T]) -> list[T]:
    """ITEMS in order, each once (by equality: the items need not be hashable)."""
    out: list[T] = []
    for item in items:
        if item not in out:
            out.append(item)
    return out
