"""The pure half of the Landlock layer: which rights each access class gets per ABI."""

from __future__ import annotations

import ctypes

import pytest

from boxy.errors import SetupError
from boxyd.stage2 import landlock as ll

ABIS = range(1, 10)
CLASSES = ("ro", "rox", "rw", "dev", "dir", "read", "scratch")
DIR_ONLY = ll.handled_fs(9) & ~ll.FS_FILE_RIGHTS


def test_handled_fs_grows_with_the_abi() -> None:
    assert ll.handled_fs(0) == 0
    assert ll.handled_fs(1) == (1 << 13) - 1
    assert ll.handled_fs(2) == ll.handled_fs(1) | ll.FS_REFER
    assert ll.handled_fs(3) == ll.handled_fs(2) | ll.FS_TRUNCATE
    assert ll.handled_fs(4) == ll.handled_fs(3)
    assert ll.handled_fs(5) == ll.handled_fs(4) | ll.FS_IOCTL_DEV
    assert ll.handled_fs(6) == ll.handled_fs(7) == ll.handled_fs(8) == ll.handled_fs(5)
    assert ll.handled_fs(9) == ll.handled_fs(8) | ll.FS_RESOLVE_UNIX


@pytest.mark.parametrize("abi", ABIS)
@pytest.mark.parametrize("access", CLASSES)
def test_every_class_is_a_nonempty_subset_of_handled(access: str, abi: int) -> None:
    mask = ll.rights_for(access, abi)
    assert mask != 0
    assert mask & ~ll.handled_fs(abi) == 0


@pytest.mark.parametrize("abi", ABIS)
def test_read_classes(abi: int) -> None:
    read = ll.FS_EXECUTE | ll.FS_READ_FILE | ll.FS_READ_DIR
    assert ll.rights_for("ro", abi) == read
    assert ll.rights_for("rox", abi) == read
    assert ll.rights_for("dir", abi) == ll.FS_READ_DIR


@pytest.mark.parametrize("abi", ABIS)
def test_tool_sandbox_classes_never_execute(abi: int) -> None:
    """A tool of boxyd's own reads the payload's tree ("read") and writes only its /tmp
    ("scratch"); nothing on either can be executed."""
    assert ll.rights_for("read", abi) == ll.FS_READ_FILE | ll.FS_READ_DIR
    scratch = ll.rights_for("scratch", abi)
    assert scratch == ll.rights_for("rw", abi) & ~ll.FS_EXECUTE
    assert not scratch & ll.FS_EXECUTE and scratch & ll.FS_WRITE_FILE


@pytest.mark.parametrize("abi", ABIS)
def test_rw_is_everything_but_ioctl_and_unix_sockets(abi: int) -> None:
    rw = ll.rights_for("rw", abi)
    assert rw == ll.handled_fs(abi) & ~(ll.FS_IOCTL_DEV | ll.FS_RESOLVE_UNIX)
    assert bool(rw & ll.FS_REFER) == (abi >= 2)
    assert bool(rw & ll.FS_TRUNCATE) == (abi >= 3)
    assert rw & ll.FS_WRITE_FILE and rw & ll.FS_MAKE_DIR and rw & ll.FS_REMOVE_FILE


@pytest.mark.parametrize("abi", ABIS)
def test_refer_only_in_rw(abi: int) -> None:
    for access in CLASSES:
        assert bool(ll.rights_for(access, abi) & ll.FS_REFER) == (
            access in ("rw", "scratch") and abi >= 2
        )


@pytest.mark.parametrize("abi", ABIS)
def test_ioctl_dev_only_in_dev(abi: int) -> None:
    for access in CLASSES:
        has = bool(ll.rights_for(access, abi) & ll.FS_IOCTL_DEV)
        assert has == (access == "dev" and abi >= 5)


@pytest.mark.parametrize("abi", ABIS)
def test_dev_class(abi: int) -> None:
    dev = ll.rights_for("dev", abi)
    assert dev & (ll.FS_READ_FILE | ll.FS_WRITE_FILE) == ll.FS_READ_FILE | ll.FS_WRITE_FILE
    assert bool(dev & ll.FS_TRUNCATE) == (abi >= 3)  # `> /dev/null` opens with O_TRUNC
    assert dev & ~ll.FS_FILE_RIGHTS == 0  # usable on a device node as it is


@pytest.mark.parametrize("abi", ABIS)
def test_no_class_grants_unix_socket_resolution(abi: int) -> None:
    for access in CLASSES:
        assert ll.rights_for(access, abi) & ll.FS_RESOLVE_UNIX == 0


@pytest.mark.parametrize("abi", ABIS)
@pytest.mark.parametrize("access", CLASSES)
def test_non_directory_stripping(access: str, abi: int) -> None:
    mask = ll.for_non_directory(ll.rights_for(access, abi))
    assert mask & DIR_ONLY == 0
    assert mask & ~ll.rights_for(access, abi) == 0  # stripping never adds
    expected_kept = ll.rights_for(access, abi) & ll.FS_FILE_RIGHTS
    assert mask == expected_kept
    if access == "dir":
        assert mask == 0  # apply() skips such a rule rather than sending an empty one


def test_file_rights_are_the_kernels_list() -> None:
    assert ll.FS_FILE_RIGHTS == (
        ll.FS_EXECUTE
        | ll.FS_WRITE_FILE
        | ll.FS_READ_FILE
        | ll.FS_TRUNCATE
        | ll.FS_IOCTL_DEV
        | ll.FS_RESOLVE_UNIX
    )


def test_unknown_class_is_refused() -> None:
    with pytest.raises(SetupError, match="unknown access class 'rwx'"):
        ll.rights_for("rwx", 7)


def test_struct_layouts() -> None:
    assert ctypes.sizeof(ll.PathBeneathAttr) == 12
    assert ll.PathBeneathAttr.parent_fd.offset == 8
    assert ctypes.sizeof(ll.NetPortAttr) == 16
    assert ctypes.sizeof(ll.RulesetAttr) == 24
    assert [ll.ruleset_size(a) for a in ABIS] == [8, 8, 8, 16, 16, 24, 24, 24, 24]


def _has(notes: list[str], needle: str) -> bool:
    return any(needle in n for n in notes)


@pytest.mark.parametrize("abi", range(0, 11))
def test_missing_features(abi: int) -> None:
    notes = ll.missing_features(abi)
    if abi == 0:
        assert notes == ["landlock unsupported by this kernel: no filesystem, port or scope rules"]
        return
    assert _has(notes, "no REFER (ABI < 2)") == (abi < 2)
    assert _has(notes, "no TRUNCATE") == (abi < 3)
    assert _has(notes, "no TCP port rules (ABI < 4)") == (abi < 4)
    assert _has(notes, "no IOCTL_DEV") == (abi < 5)
    assert _has(notes, "no scoping (ABI < 6)") == (abi < 6)
    assert _has(notes, f"landlock ABI {abi}: no unix-socket rights (ABI 9)") == (abi < 9)
    if abi >= 9:
        assert notes == []


def test_missing_features_abi7_is_the_machines_line() -> None:
    assert ll.missing_features(7) == [
        "landlock ABI 7: no unix-socket rights (ABI 9): a connect() to a pathname socket "
        "inside an exposed tree is not stopped by Landlock"
    ]
