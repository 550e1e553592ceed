"""boxyctl.shellquote and the hook's pattern tests (boxyctl/hookpolicy.py) against the
shlex and re they stand in for, on every short string of a hostile alphabet and
on random longer ones: the same answer for each."""

from __future__ import annotations

import itertools
import random
import re
import shlex

import pytest

from boxyctl import hookpolicy as hp
from boxyctl import shellquote

# the characters each one tells apart, and some it must not
ALPHABET = "aZ_09+=.-@%:,/ '\"$()`\\\t\n;é\x00"


def strings(max_len: int, extra: int) -> list[str]:
    short = ["".join(t) for n in range(max_len + 1) for t in itertools.product(ALPHABET, repeat=n)]
    rng = random.Random(18)
    long = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(4, 40))) for _ in range(extra)]
    return short + long


CASES = strings(3, 20000)


def test_quote_is_shlex_quote() -> None:
    for s in CASES:
        assert shellquote.quote(s) == shlex.quote(s), s


def test_join_is_shlex_join() -> None:
    rng = random.Random(7)
    for _ in range(5000):
        argv = rng.sample(CASES, rng.randint(0, 5))
        assert shellquote.join(argv) == shlex.join(argv), argv


def test_a_quoted_word_comes_back_whole() -> None:
    for s in CASES[-2000:]:
        if "\x00" not in s:
            assert shlex.split(shellquote.quote(s)) == [s]


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")
_PYTHON = re.compile(r"python[0-9.]*")


def test_is_assignment_is_the_pattern() -> None:
    for s in [*CASES, "A1_+=x", "_=", "9a=1", "a+b=1", "a++=1", "é=1"]:
        assert hp.is_assignment(s) == bool(_ASSIGNMENT.match(s)), s


@pytest.mark.parametrize("suffix", ["", "3", "3.11", "2.7.18", ".", "3a", "-3", " ", "é", "3\n"])
def test_is_python_is_the_pattern(suffix: str) -> None:
    for name in (f"python{suffix}", f"xpython{suffix}", f"pytho{suffix}"):
        assert hp.is_python(name) == bool(_PYTHON.fullmatch(name)), name


def test_substitutions_are_the_pattern() -> None:
    extra = ["$()", "a $(b) c $(d) e", "$(a", "a)$(", "$($(x))", ")$(y)", "`a` $(b) `c"]
    for s in [*CASES, *extra]:
        want = [m.group(1) for m in re.finditer(r"\$\((.*)\)", s, re.S)] + s.split("`")[1::2]
        assert hp._substitutions(s) == want, s
