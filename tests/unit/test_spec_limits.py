"""boxyd.config.limits: limits, logs and terminal; and each step's result names
RunSpec's own fields."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest

from boxy.errors import UsageError
from boxy.request import RunOptions
from boxyd.config import environment, filesystem, limits, network
from boxyd.config.profileschema import Profile
from boxyd.config.runspec import RunSpec


def prof(**kw: Any) -> Profile:
    return Profile(name="p", source="p.yaml", **kw)


@pytest.mark.parametrize(
    "step", [network.Network, filesystem.Filesystem, limits.Limits, limits.Logs, limits.Terminal]
)
def test_each_step_result_is_a_part_of_runspec(step: type) -> None:
    # build_spec hands each result to RunSpec by field name: same names, same types
    spec = typing.get_type_hints(RunSpec)
    for name, kind in typing.get_type_hints(step).items():
        assert spec[name] == kind, name
    assert "env" in spec and typing.get_type_hints(environment.decide)["return"] == spec["env"]


def test_limits_default() -> None:
    assert limits.limits(RunOptions(), prof()) == limits.Limits(
        2 << 30, 512, None, None, 4 << 30, "strict"
    )


def test_limits_the_flag_over_the_profile() -> None:
    p = prof(memory=1 << 30, pids=64, cpus=2.0, timeout=60.0, seccomp="compat", review=True)
    p.review_limit = 1 << 30
    assert limits.limits(RunOptions(), p) == limits.Limits(
        1 << 30, 64, 2.0, 60.0, 1 << 30, "compat"
    )
    o = RunOptions(
        memory=4 << 30, pids=100, cpus=1, timeout=5, seccomp="strict", review_limit=5 << 20
    )
    got = limits.limits(o, p)
    assert got == limits.Limits(4 << 30, 100, 1.0, 5.0, 5 << 20, "strict")
    assert isinstance(got.cpus, float) and isinstance(got.timeout, float)


def test_a_review_limit_needs_a_review() -> None:
    with pytest.raises(UsageError) as e:
        limits.limits(RunOptions(review_limit=1 << 30), prof())
    assert str(e.value) == "--review-limit: needs --review (or a profile with review: true)"
    with pytest.raises(UsageError, match="--review-limit 1000B: below the minimum of 1MiB"):
        limits.limits(RunOptions(review=True, review_limit=1000), prof())


def test_limits_below_the_minimum_are_refused() -> None:
    with pytest.raises(UsageError) as e:
        limits.limits(RunOptions(memory=1000), prof())
    assert str(e.value) == (
        "--memory 1000B: below the minimum of 1MiB (a plain number is bytes: write 512MiB or 2GiB)"
    )
    with pytest.raises(UsageError) as e:
        limits.limits(RunOptions(), prof(pids=7))
    assert str(e.value) == (
        "--pids 7: below the minimum of 8 (the sandbox's own init, the payload and its "
        "shell's children all count)"
    )


def test_an_unknown_seccomp_mode_is_refused() -> None:
    with pytest.raises(UsageError) as e:
        limits.limits(RunOptions(seccomp="off"), prof())
    assert str(e.value) == "Run: options.seccomp: expected strict or compat"


def test_logs_default() -> None:
    assert limits.logs(RunOptions(), "/") == limits.Logs(None, None, None, 1 << 30)


def test_logs_are_absolute_in_a_directory_that_exists(tmp_path: Path) -> None:
    o = RunOptions(audit_log="a.log", net_log=str(tmp_path / "n.log"), pcap="p.pcap", pcap_max=99)
    got = limits.logs(o, str(tmp_path))
    assert got == limits.Logs(
        str(tmp_path / "a.log"), str(tmp_path / "n.log"), str(tmp_path / "p.pcap"), 99
    )


@pytest.mark.parametrize(
    ("key", "flag"), [("audit_log", "--audit-log"), ("net_log", "--net-log"), ("pcap", "--pcap")]
)
def test_a_log_in_a_missing_directory_is_refused(tmp_path: Path, key: str, flag: str) -> None:
    with pytest.raises(UsageError) as e:
        limits.logs(RunOptions(**{key: "no/x"}), str(tmp_path))
    assert str(e.value) == f"{flag} {tmp_path}/no/x: {tmp_path}/no is not a directory"


def test_pcap_max_is_taken_as_given() -> None:
    # without --pcap it is refused before (network.decide, with the option table's checks)
    assert limits.logs(RunOptions(pcap_max=10), "/").pcap_max == 10


def test_terminal() -> None:
    notes: list[str] = []
    assert limits.terminal(RunOptions(), prof(), notes) == limits.Terminal(False, False, False)
    assert limits.terminal(RunOptions(tty=True), prof(), notes).tty
    assert limits.terminal(RunOptions(), prof(tty=True), notes).tty
    assert limits.terminal(RunOptions(detach=True), prof(), notes).detach
    assert notes == []


def test_a_detached_terminal_is_refused() -> None:
    for o, p in (
        (RunOptions(tty=True, detach=True), prof()),
        (RunOptions(detach=True), prof(tty=True)),
    ):
        with pytest.raises(UsageError) as e:
            limits.terminal(o, p, [])
        assert str(e.value) == (
            "--tty: cannot be combined with -d (a detached session has its own "
            "terminal; `boxyctl attach` takes it over)"
        )


def test_an_unfiltered_terminal_is_said() -> None:
    notes: list[str] = []
    assert limits.terminal(RunOptions(tty_raw=True), prof(), notes).tty_raw
    assert limits.terminal(RunOptions(), prof(tty_raw=True), notes).tty_raw
    tail = (
        ": the payload's output reaches the terminal unfiltered "
        "(clipboard writes and queries included)"
    )
    assert notes == ["--tty-raw" + tail, "profile p.yaml: tty_raw" + tail]


def test_fields_hand_over_each_field() -> None:
    from boxyd.config.spec import _fields

    got = _fields(limits.Terminal(True, False, True))
    assert got == {"tty": True, "tty_raw": False, "detach": True}
    assert [f.name for f in dataclasses.fields(limits.Terminal)] == list(got)


def test_memory_above_the_machines_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "machine_memory", lambda: 23 << 30)
    with pytest.raises(UsageError) as e:
        limits.limits(RunOptions(memory=100 << 40), prof())
    assert str(e.value) == (
        "--memory 100.0TiB: more than this machine's 23.0GiB of memory, so it would "
        "limit nothing; give less, or leave it out for the default"
    )
    assert limits.limits(RunOptions(memory=8 << 30), prof()).memory == 8 << 30
    # a profile's value is kept: profiles are shared between machines
    assert limits.limits(RunOptions(), prof(memory=100 << 40)).memory == 100 << 40
