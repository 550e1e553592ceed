"""The second round of attacks on --review, in process (docs/design.md, "Changes held
for review"): the plan's pins over the overlay, the layer's measure, the review's
walk of entries it cannot read."""

from __future__ import annotations

from boxyd.config.runspec import PathEntry, RunSpec
from boxyd.gitguard.discover import Protection
from boxyd.plan import mountplan
from boxyd.plan.ops import Bind, Overlay

WORK = "/home/u/proj"
PINS = [Protection(".git", "self", True), Protection(".git/config", "ro", False)]


def test_under_review_no_pin_of_the_work_directory_comes_from_the_host() -> None:
    spec = RunSpec(argv=["true"], workdir=WORK, rw=[PathEntry("/home/u/other")])
    prots = {WORK: PINS, "/home/u/other": PINS}
    ops, _ = mountplan.user_ops(spec, prots, review=("/s/upper", "/s/work"))
    assert isinstance(ops[0], Overlay)
    pins = [op for op in ops if isinstance(op, Bind) and op.dst_base == WORK]
    assert [p.dst for p in pins] == [".git", ".git/config"]
    # a pin taken from the host over the overlay: the host's .git, writable, unreviewed
    assert all(p.in_place for p in pins), pins
    # a --rw tree is not held for review: its pins are as a live run's
    other = [op for op in ops if isinstance(op, Bind) and op.dst_base == "/home/u/other"]
    assert other and not any(p.in_place for p in other)


def test_a_live_run_takes_its_pins_from_the_host() -> None:
    ops, _ = mountplan.user_ops(RunSpec(argv=["true"], workdir=WORK), {WORK: PINS})
    assert not any(op.in_place for op in ops if isinstance(op, Bind))
