"""boxyd.net.placeholder: a secret's stand-in has the value's shape, is never the
value, and has the randomness that makes it findable by its exact bytes."""

from __future__ import annotations

import itertools
import string

import pytest

from boxyd.net import placeholder

TOKENS = [
    "ghp_" + "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI3kM5",  # GitHub classic
    "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVW",
    "npm_" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa",
    "glpat-xY3zW9vU7tS5rQ1pO2nM",
    "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6",
    "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "3f1c9a7e5b2d4c6e8f0a1b3c5d7e9f0a",  # hex, lowercase
    "3F1C9A7E5B2D4C6E8F0A1B3C5D7E9F0A",  # hex, uppercase
    "dGhpcyBpcyBhIGJhc2U2NCB0b2tlbiB3aXRoIHBhZA==",  # base64, padded
    "boxy-secret-3f1c9a7e-not-for-logs-4b8d9e",
    "12345678901234567890123",  # digits only
    "pässwörd-ÄÖÜ-with-enough-letters-abcdefgh",  # not ASCII: kept as the shape
]


@pytest.mark.parametrize("value", TOKENS)
def test_same_shape_never_the_value(value: str) -> None:
    seen = set()
    for _ in range(200):
        ph = placeholder.make(value)
        assert placeholder.same_shape(value, ph), (value, ph)
        assert len(ph) == len(value) and ph != value and value not in ph
        assert ph.startswith(placeholder.prefix(value))
        seen.add(ph)
    assert len(seen) == 200  # fresh each time


def test_each_position_keeps_its_class() -> None:
    value = "ghp_aZ9-x.Y/0+q=" + "Ab1" * 20
    ph = placeholder.make(value)
    for a, b in zip(value, ph, strict=True):
        if a in string.ascii_lowercase:
            assert b in string.ascii_lowercase
        elif a in string.ascii_uppercase:
            assert b in string.ascii_uppercase
        elif a in string.digits:
            assert b in string.digits
        else:
            assert a == b


def test_hex_stays_hex() -> None:
    for value in ("3f1c9a7e5b2d4c6e8f0a1b3c5d7e9f0a", "3F1C9A7E5B2D4C6E8F0A1B3C5D7E9F0A"):
        ph = placeholder.make(value)
        assert set(ph) <= set(string.hexdigits)
        assert ph.isupper() or ph.isdigit() if value.isupper() else ph == ph.lower()


def test_prefixes() -> None:
    assert placeholder.prefix("ghp_abc") == "ghp_"
    assert placeholder.prefix("github_pat_11AB") == "github_pat_"
    assert placeholder.prefix("sk-proj-abc") == "sk-proj-"
    assert placeholder.prefix("glpat-abc") == "glpat-"
    assert placeholder.prefix("3f1c9a7e-4b2c") == ""  # digits: the token's own
    assert placeholder.prefix("abcdef") == ""  # no word ended by _ or -
    assert placeholder.prefix("ghp_") == ""  # the whole value is never kept
    assert placeholder.prefix("sk-ant-api03-abc") == "sk-ant-api03-"  # the longest kind
    assert placeholder.prefix("boxy-secret-3f1c") == ""  # a value's own words: the value


@pytest.mark.parametrize("value", ["", "abc", "ghp_abc", "x" * 13, "----____----", "1234567890"])
def test_too_short_is_refused(value: str) -> None:
    with pytest.raises(placeholder.TooShort):
        placeholder.make(value)


def test_enough_bits_is_the_threshold() -> None:
    # 14 lowercase letters: 65.8 bits; 13: 61.1
    assert placeholder.bits("q" * 14) > placeholder.MIN_BITS > placeholder.bits("q" * 13)
    placeholder.make("q" * 14)
    with pytest.raises(placeholder.TooShort):
        placeholder.make("q" * 13)


def test_taken_is_avoided() -> None:
    value = "q" * 14
    first = placeholder.make(value)
    second = placeholder.make(value, taken=frozenset({first}))
    assert second != first


def test_same_shape_rejects_each_kind_of_difference() -> None:
    value = "ghp_aZ9-" + "b" * 20
    good = placeholder.make(value)
    assert not placeholder.same_shape(value, good + "x")  # length
    assert not placeholder.same_shape(value, "gho_" + good[4:])  # prefix
    assert not placeholder.same_shape(value, good[:4] + "A" + good[5:])  # class
    assert not placeholder.same_shape(value, good[:7] + "_" + good[8:])  # punctuation


def test_every_short_shape_exhaustively() -> None:
    # every value of 16 characters over one of each class: the shape holds
    for combo in itertools.product("aZ9_", repeat=4):
        value = "".join(combo) * 4
        if placeholder.bits(value) < placeholder.MIN_BITS:
            with pytest.raises(placeholder.TooShort):
                placeholder.make(value)
            continue
        assert placeholder.same_shape(value, placeholder.make(value))
