"""The site set-up that boxyctl's own scripts skip at start-up (boxyctl/launcher.py
says why), for whatever needs more than the standard library."""

from __future__ import annotations

import sys

_done = False


def ensure_site() -> None:
    """site.main (the venv, its site-packages and their .pth files, the user's site)
    once, in an interpreter started with -S; nothing in one started with site."""
    global _done
    if not sys.flags.no_site or _done:
        return
    import site

    site.main()
    _done = True
