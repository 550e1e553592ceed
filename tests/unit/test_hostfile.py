"""hostfile: the files boxyd writes for a run, opened so that the payload cannot choose
what they are. Real files, FIFOs, symlinks and hard links on this machine."""

from __future__ import annotations

import os
import re
import stat
import threading
from pathlib import Path

import pytest

from boxy.errors import UsageError
from boxyd.plan.hostfile import open_output, open_outputs


def test_regular_file_is_created_0600_and_appended(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    for line in (b"one\n", b"two\n"):
        fd = open_output("--audit-log", str(path), [], truncate=False)
        os.write(fd, line)
        os.close(fd)
    assert path.read_bytes() == b"one\ntwo\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_truncate_happens_after_the_checks(tmp_path: Path) -> None:
    path = tmp_path / "cap.pcap"
    path.write_bytes(b"old contents")
    fd = open_output("--pcap", str(path), [], truncate=True)
    os.close(fd)
    assert path.read_bytes() == b""
    other = tmp_path / "precious"
    other.write_bytes(b"keep")
    os.link(other, tmp_path / "linked.pcap")
    with pytest.raises(UsageError, match="hard links"):
        open_output("--pcap", str(tmp_path / "linked.pcap"), [], truncate=True)
    assert other.read_bytes() == b"keep"  # refused before anything was truncated


def test_fifo_is_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    os.mkfifo(path)
    got: list[BaseException | None] = []

    def call() -> None:
        try:
            open_output("--audit-log", str(path), [], truncate=False)
            got.append(None)
        except BaseException as e:
            got.append(e)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():  # no reader: a blocking open waits forever; be the reader, then fail
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        raise AssertionError("open_output blocked opening the FIFO")
    assert isinstance(got[0], UsageError), got
    assert re.match(r"--audit-log .*audit\.jsonl: is a FIFO", str(got[0])), got


@pytest.mark.parametrize("kind", ["symlink", "directory", "socket"])
def test_other_kinds_are_refused(tmp_path: Path, kind: str) -> None:
    import socket

    path = tmp_path / "out"
    if kind == "symlink":
        (tmp_path / "real").write_text("")
        path.symlink_to(tmp_path / "real")
    elif kind == "directory":
        path.mkdir()
    else:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
    with pytest.raises(UsageError, match=r"^--net-log "):
        open_output("--net-log", str(path), [], truncate=False)
    if kind == "symlink":
        assert (tmp_path / "real").read_text() == ""


def test_symlinked_directory_inside_a_writable_tree_is_refused(tmp_path: Path) -> None:
    """`rmdir logs && ln -s ~/.ssh logs`: boxyd must not create its log over there."""
    work, ssh = tmp_path / "work", tmp_path / "ssh"
    work.mkdir()
    ssh.mkdir()
    (work / "logs").symlink_to(ssh)
    with pytest.raises(UsageError, match="logs is a symlink inside a tree the sandbox can write"):
        open_output("--audit-log", str(work / "logs/audit.jsonl"), [str(work)], truncate=False)
    assert list(ssh.iterdir()) == []


def test_symlinks_above_the_writable_trees_are_followed(tmp_path: Path) -> None:
    """The user's own layout (/home -> /usr/home) is not the payload's doing."""
    real = tmp_path / "real"
    (real / "work/logs").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(real)
    fd = open_output(
        "--audit-log",
        str(tmp_path / "alias/work/logs/a.jsonl"),
        [str(real / "work")],
        truncate=False,
    )
    os.close(fd)
    assert (real / "work/logs/a.jsonl").exists()
    # and reached through that alias, a symlink below the writable root is still refused
    (real / "work/link").symlink_to(real / "work/logs")
    with pytest.raises(UsageError, match="link is a symlink"):
        open_output(
            "--audit-log",
            str(tmp_path / "alias/work/link/a.jsonl"),
            [str(real / "work")],
            truncate=False,
        )


def test_open_outputs_closes_what_it_opened_when_one_fails(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(UsageError, match="--pcap"):
        open_outputs(str(tmp_path / "a"), str(tmp_path / "n"), str(tmp_path / "fifo"), [])
    assert len(os.listdir("/proc/self/fd")) == before
