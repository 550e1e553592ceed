"""The mount plan: order, safe resolution under writable trees, refusals."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

import pytest

from boxy.errors import UsageError
from boxyd.config.runspec import CopyEntry, PathEntry, RunSpec
from boxyd.gitguard.discover import Protection
from boxyd.plan import mountplan
from boxyd.plan.ops import (
    Bind,
    Copy,
    File,
    Init,
    LandlockRule,
    MountOp,
    NetPlan,
    Outer,
    Plan,
    Symlink,
    split_wire,
    to_wire,
)


def _spec(**kw: Any) -> RunSpec:
    return RunSpec(argv=["true"], workdir="/home/u/proj", **kw)


def _binds(plan_ops: Iterable[MountOp]) -> list[Bind]:
    return [op for op in plan_ops if isinstance(op, Bind)]


def test_workdir_is_a_writable_bind_from_the_host_path() -> None:
    ops, rules = mountplan.user_ops(_spec(), {})
    (b,) = _binds(ops)
    assert (b.src, b.dst, b.ro, b.src_base, b.dst_base) == (
        "/home/u/proj",
        "/home/u/proj",
        False,
        None,
        None,
    )
    assert [(r.path, r.access) for r in rules] == [("/home/u/proj", "rw")]


def test_paths_inside_a_writable_tree_are_resolved_beneath_it() -> None:
    spec = _spec(ro=[PathEntry("/home/u/proj/vendor")], protect=[PathEntry("/home/u/proj/.env")])
    ops, _ = mountplan.user_ops(spec, {})
    binds = _binds(ops)
    assert [b.dst for b in binds] == ["/home/u/proj", "vendor", ".env"]
    for b in binds[1:]:
        assert b.src_base == b.dst_base == "/home/u/proj" and b.ro


def test_parents_are_mounted_before_children() -> None:
    spec = _spec(ro=[PathEntry("/home/u")], rw=[PathEntry("/home/u/proj/out")])
    ops, _ = mountplan.user_ops(spec, {})
    order = [(b.src_base or "") + "/" + b.src if b.src_base else b.src for b in _binds(ops)]
    assert order.index("/home/u") < order.index("/home/u/proj")


def test_git_protections_follow_their_tree_and_symlinks_are_refused() -> None:
    prots = {
        "/home/u/proj": [Protection(".git", "self", True), Protection(".git/hooks", "ro", True)]
    }
    ops, _ = mountplan.user_ops(_spec(), prots)
    binds = _binds(ops)
    assert [(b.dst, b.ro, b.dst_base) for b in binds[1:]] == [
        (".git", False, "/home/u/proj"),
        (".git/hooks", True, "/home/u/proj"),
    ]
    bad = {"/home/u/proj": [Protection(".git/hooks", "ro", True, symlink=True)]}
    with pytest.raises(UsageError, match="symlink"):
        mountplan.user_ops(_spec(), bad)


def test_under_review_the_work_trees_pins_come_from_the_overlay() -> None:
    """--review: a gitdir bound onto itself from the host took the payload's commits
    there at once; each pin of the work directory is taken from the sandbox's view
    (the overlay), a --rw tree's from the host as before."""
    prots = {
        "/home/u/proj": [Protection(".git", "self", True), Protection(".git/hooks", "ro", True)],
        "/data": [Protection(".git", "self", True)],
    }
    spec = _spec(rw=[PathEntry("/data")])
    ops, _ = mountplan.user_ops(spec, prots, review=("/state/upper", "/state/work"))
    pins = [(b.src_base, b.dst, b.in_place) for b in _binds(ops) if b.src_base]
    assert sorted(pins) == [
        ("/data", ".git", False),
        ("/home/u/proj", ".git", True),
        ("/home/u/proj", ".git/hooks", True),
    ]
    ops, _ = mountplan.user_ops(spec, prots)
    assert not any(b.in_place for b in _binds(ops))


def test_under_review_a_pin_of_a_tree_around_the_work_directory_is_the_overlays() -> None:
    """--review --rw ~/parent: that tree's walk pins the work directory's repository
    (the directory above it and its gitdir: `self` pins, writable), and from the host
    they sat over the overlay: the payload's every write in the work directory reached
    the host. A pin inside the work directory is the overlay's, whichever tree's it is."""
    prots = {
        "/home/u": [
            Protection("proj", "self", True),
            Protection("proj/.git", "self", True),
            Protection("other/.git", "self", True),
        ],
    }
    spec = _spec(rw=[PathEntry("/home/u")], review=True)
    assert mountplan.writable_roots(spec) == ["/home/u", "/home/u/proj"]
    ops, _ = mountplan.user_ops(spec, prots, review=("/state/upper", "/state/work"))
    pins = [(b.src_base, b.dst, b.in_place) for b in _binds(ops) if b.src_base]
    assert sorted(pins) == [
        ("/home/u", "other/.git", False),
        ("/home/u", "proj", True),
        ("/home/u", "proj/.git", True),
    ]
    i = [type(op).__name__ for op in ops].index("Overlay")
    assert all(ops.index(b) > i for b in _binds(ops) if b.in_place)  # on the overlay


def test_under_review_a_writable_tree_inside_the_work_directory_is_held_too() -> None:
    """--review --rw ./sub --mkdir ./made: both were bound from the host over the
    overlay, so the payload's writes there reached the host and the run said it changed
    nothing. Each is taken from the overlay now (made there), and is no writable tree
    of its own; a --rw tree elsewhere is still the host's, written as the run goes."""
    spec = _spec(
        rw=[PathEntry("/home/u/proj/sub"), PathEntry("/data")],
        mkdir=[PathEntry("/home/u/proj/made")],
        ro=[PathEntry("/home/u/proj/vendor")],
        review=True,
    )
    assert mountplan.writable_roots(spec) == ["/data", "/home/u/proj"]
    ops, rules = mountplan.user_ops(spec, {}, review=("/state/upper", "/state/work"))
    got = {(b.src_base, b.src): (b.ro, b.create, b.in_place) for b in _binds(ops)}
    assert got == {
        (None, "/data"): (False, False, False),
        ("/home/u/proj", "sub"): (False, False, True),
        ("/home/u/proj", "made"): (False, True, True),
        ("/home/u/proj", "vendor"): (True, False, False),  # read-only: the host's, unwritable
    }
    assert ("/home/u/proj/sub", "rw") in [(r.path, r.access) for r in rules]
    plain = dataclasses.replace(spec, review=False)
    assert sorted(mountplan.writable_roots(plain)) == [
        "/data",
        "/home/u/proj",
        "/home/u/proj/made",
        "/home/u/proj/sub",
    ]
    ops, _ = mountplan.user_ops(plain, {})
    assert not any(b.in_place for b in _binds(ops))


def test_copy_into_an_exposed_tree_is_refused() -> None:
    with pytest.raises(UsageError, match="inside the exposed tree"):
        mountplan.user_ops(_spec(copy=[CopyEntry("/home/u/.creds", "/home/u/proj/.creds")]), {})
    ops, rules = mountplan.user_ops(
        _spec(copy_ro=[CopyEntry("/home/u/.creds", "/home/u/.creds")]), {}
    )
    assert any(isinstance(op, Copy) and op.ro for op in ops)
    assert ("/home/u/.creds", "ro") in [(r.path, r.access) for r in rules]


def test_plan_round_trips_through_json_and_has_no_host_etc() -> None:
    plan = mountplan.build(_spec(), seccomp_bpf=b"\0" * 8, protections={}, ctty=False)
    again = Plan.from_json(plan.to_json())
    assert again == plan
    etc_binds = [b.src for b in _binds(plan.ops) if b.src.startswith("/etc")]
    assert (
        "/etc/passwd" not in etc_binds
        and "/etc/shadow" not in etc_binds
        and "/etc" not in etc_binds
    )
    assert all(
        isinstance(op, (Bind, Symlink))
        for op in plan.ops
        if getattr(op, "dst", "") in ("/bin", "/usr")
    )
    assert ("/", "dir") in [(r.path, r.access) for r in plan.landlock]


def test_the_plan_is_made_whole_in_one_pure_call_and_then_frozen() -> None:
    """Issue 32 §2: the network's part, the terminal and the tailnet's resolver went in
    after the build (daemon/network.py and sandbox.py edited the plan); now build takes
    them, a test makes the plan without a daemon, and nothing can edit it afterwards."""
    net = NetPlan('{"nftables": []}', [443], pcap=True, search="t.ts.net")
    pty = {"termios": [1, 2], "winsize": [24, 80, 0, 0], "fds": [0, 1, 2]}
    plan = mountplan.build(
        _spec(net="allowlist"), seccomp_bpf=b"", protections={}, ctty=True, net=net, pty=pty
    )
    assert (plan.net_ruleset, plan.landlock_ports, plan.pcap) == (net.ruleset, [443], True)
    assert plan.pty == pty and plan.ctty
    (resolv,) = [op for op in plan.ops if isinstance(op, File) and op.dst == "/etc/resolv.conf"]
    assert resolv.content.endswith("search t.ts.net\n")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.net_ruleset = None  # type: ignore[misc]  # the point: it cannot be done
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolv.content = ""  # type: ignore[misc]
    bare = mountplan.build(_spec(), seccomp_bpf=b"", protections={}, ctty=False)
    assert (bare.net_ruleset, bare.landlock_ports, bare.pcap, bare.pty) == (None, None, False, None)


def _sample_plan(**kw: object) -> Plan:
    fields: dict[str, object] = {
        "argv": ["true"],
        "env": {"A": "b"},
        "cwd": "/w",
        "uid": 1,
        "gid": 1,
        "home": "/h",
        "hostname": "x",
        "scratch_size": 1,
        "ops": [Bind("/usr", "/usr", True), File("/etc/x", "c")],
        "landlock": [LandlockRule("/", "dir")],
        "seccomp_bpf": "",
        "nproc": 5,
        "pty": {"termios": [1, 2], "winsize": [1, 2, 0, 0], "fds": [0]},
    }
    return Plan(**{**fields, **kw})  # type: ignore[arg-type]


def test_plan_to_json_is_asdict_and_round_trips() -> None:
    p = _sample_plan()
    assert p.to_json() == dataclasses.asdict(p)
    assert Plan.from_json(json.loads(json.dumps(p.to_json()))) == p


def test_the_wire_gives_the_outer_stage_2_its_line_and_pid_1_the_plan() -> None:
    """The outer stage 2 decodes one short line (Outer) and never the plan: what it
    decodes stays in its memory for the session (issue #18)."""
    ruleset = json.dumps({"nftables": [{"table": {"family": "inet", "name": "boxy"}}]})
    # a newline in the plan never splits it early
    p = _sample_plan(argv=["a\nb"], uid=7, gid=8, hostname="box", net="public")
    p = dataclasses.replace(p, net_ruleset=ruleset, pcap=True)
    head, rest = split_wire(to_wire(p))
    outer = Outer.from_json(json.loads(head))
    assert outer == Outer(7, 8, "box", "public", ruleset, True, True)
    line, inner = split_wire(rest)
    assert Init.from_json(json.loads(line)) == Init(5, None, False, [0], "")
    assert Plan.from_json(json.loads(inner)) == dataclasses.replace(p, net_ruleset=None)
    with pytest.raises(ValueError):
        split_wire(json.dumps(p.to_json()).encode())  # a plan without the line
