"""Shared by the parser tests: a seeded mutation fuzzer bounded in CPU time, and a
size sweep that fails on superlinear growth.

Neither makes a speed claim. The fuzzer's inputs are the same for a given seed
(how many of them run depends on the machine); the sweep compares a parser with
itself at sizes N and 8N, which catches O(n²) (a ratio near 64) on any machine.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

FUZZ_SECONDS = 0.5
MIN_CASES = 50  # fewer than this in FUZZ_SECONDS: the parser is far too slow on small input


def mutations(
    seeds: Sequence[bytes], tokens: Sequence[bytes], *, seed: int, seconds: float = FUZZ_SECONDS
) -> Iterator[bytes]:
    """Mutants of SEEDS (bytes inserted, dropped, flipped, slices repeated, TOKENS
    spliced in, sometimes thousands of times) until SECONDS of CPU have gone."""
    rng = random.Random(seed)
    deadline = time.process_time() + seconds
    cases = 0
    while time.process_time() < deadline or cases < MIN_CASES:
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 6)):
            _mutate(rng, data, tokens)
        cases += 1
        yield bytes(data)
    assert time.process_time() < deadline + seconds, f"only {cases} cases in {2 * seconds}s"


def _mutate(rng: random.Random, data: bytearray, tokens: Sequence[bytes]) -> None:
    at = rng.randint(0, len(data))
    op = rng.randrange(6)
    if op == 0:
        data[at:at] = bytes([rng.randrange(256)])
    elif op == 1 and data:
        del data[at : at + rng.randint(1, 8)]
    elif op == 2 and at < len(data):
        data[at] ^= 1 << rng.randrange(8)
    elif op == 3 and data:
        start = rng.randrange(len(data))
        data[at:at] = data[start : start + rng.randint(1, 16)] * rng.randint(1, 4)
    elif op == 4:
        data[at:at] = rng.choice(tokens)
    else:  # the shapes that find quadratic and recursive paths: long runs of one token
        data[at:at] = rng.choice(tokens) * rng.choice((10, 100, 1000, 5000))


def _cpu(run: Callable[[Any], Any], arg: Any, floor: float = 0.05) -> float:
    """CPU seconds of one RUN(ARG) (repeated for FLOOR seconds at least, so a fast
    one is still measured above the clock's resolution)."""
    t0 = time.process_time()
    reps = 0
    while True:
        run(arg)
        reps += 1
        spent = time.process_time() - t0
        if spent >= floor:
            return spent / reps


def assert_linear(
    make: Callable[[int], Any],
    run: Callable[[Any], Any],
    n: int,
    *,
    factor: int = 8,
    bound: float = 30.0,
    floor: float = 0.05,
    rounds: int = 3,
) -> None:
    """RUN on MAKE(FACTOR*N) must cost less than BOUND times RUN on MAKE(N): linear
    growth gives about FACTOR, quadratic FACTOR². FLOOR and ROUNDS: the CPU each
    measure takes at least, and how many of each size (the best counts): a file of
    hundreds of sweeps takes less of both (the suite's time)."""
    small, big = make(n), make(factor * n)
    # interleaved, the best of each: a burst of load on a shared machine (CPU time
    # still grows with cache and core contention) lands on both sizes, not on one.
    # The collector is off meanwhile: after the rest of the suite its full passes walk
    # a large heap, and the bigger input, allocating more, paid for more of them
    # (48x in a full run, 8x alone): the parser's cost is what is measured here.
    t_small = t_big = float("inf")
    was_on = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            t_small = min(t_small, _cpu(run, small, floor))
            t_big = min(t_big, _cpu(run, big, floor))
    finally:
        if was_on:
            gc.enable()
    ratio = t_big / max(t_small, 1e-9)
    assert ratio < bound, (
        f"{factor}x the input cost {ratio:.1f}x the time "
        f"({t_small * 1e3:.2f} ms -> {t_big * 1e3:.2f} ms)"
    )
