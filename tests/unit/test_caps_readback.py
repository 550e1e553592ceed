"""caps.verify_dropped: the read-back of step 7 (docs/design.md) fails closed."""

from __future__ import annotations

import os

import pytest

from boxy.errors import SetupError
from boxyd.stage2 import caps

SETS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


def status_fd(lines: dict[str, str]) -> int:
    fd = os.memfd_create("status")
    text = "Name:\tboxy-init\nUmask:\t0022\n" + "".join(f"{k}:\t{v}\n" for k, v in lines.items())
    os.write(fd, (text + "NoNewPrivs:\t1\nSeccomp:\t2\n").encode())
    return fd


def test_all_sets_empty_passes() -> None:
    fd = status_fd({k: "0" * 16 for k in SETS})
    try:
        caps.verify_dropped(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("held", SETS)
def test_any_capability_left_fails(held: str) -> None:
    fd = status_fd({k: ("0000000000000400" if k == held else "0" * 16) for k in SETS})
    try:
        with pytest.raises(SetupError, match=held):
            caps.verify_dropped(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("missing", SETS)
def test_a_missing_line_fails(missing: str) -> None:
    fd = status_fd({k: "0" * 16 for k in SETS if k != missing})
    try:
        with pytest.raises(SetupError, match=missing):
            caps.verify_dropped(fd)
    finally:
        os.close(fd)


def test_a_lookalike_key_is_not_read() -> None:
    # "XCapEff" is not CapEff: the key must start its line
    lines = {k: "0" * 16 for k in SETS if k != "CapEff"} | {"XCapEff": "0" * 16}
    fd = status_fd(lines)
    try:
        with pytest.raises(SetupError, match="CapEff"):
            caps.verify_dropped(fd)
    finally:
        os.close(fd)


def test_the_process_own_status_is_read_without_a_descriptor() -> None:
    with open("/proc/self/status") as f:
        held = [k for k, v in (ln.split(":\t", 1) for ln in f if ":\t" in ln)
                if k in SETS and int(v, 16)]  # fmt: skip
    if not held:  # (inside a sandbox)
        caps.verify_dropped()
        return
    with pytest.raises(SetupError, match=held[0]):
        caps.verify_dropped()
