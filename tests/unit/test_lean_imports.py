"""What the long-lived processes leave out of their imports, for memory (issue #18's
scale figures; bench/sessions.py measures them): boxyd maps no OpenSSL (hashlib,
ssl: 5 MiB of its resident memory) and no decimal; the stage-2 template imports no
threading, whose hook after fork ran in each of its children (each outer stage 2 and
each PID 1) and copied ~400 KiB of the template's pages in every one."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _imported(module: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys, {module}; print(' '.join(sys.modules))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return set(out.split())


@pytest.mark.parametrize("module", ["boxyd.__main__", "boxyd.daemon.walkproc"])
def test_the_daemon_maps_no_openssl_and_no_decimal(module: str) -> None:
    assert _imported(module) & {"ssl", "_ssl", "hashlib", "_hashlib", "decimal"} == set()


def test_the_stage2_template_imports_no_threading() -> None:
    assert "threading" not in _imported("boxyd.stage2.__main__")
