"""A secret's stand-in (`--secret NAME@HOST`): what the payload's $NAME holds instead
of the value. Pure.

Same length, and each position drawn from its own character's class (a lowercase
letter for one, a digit for a digit, a hex letter for a hex token's letter), so a
tool that checks a token's form before sending it (`ghp_` and 36 alphanumerics) sends
the placeholder as it would the value. A token's kind (`ghp_`, `github_pat_`,
`sk-proj-`: KINDS, a fixed public list) and its punctuation are kept: they say which
kind of token it is, not which token. No other letter or digit of the value is kept:
a value's own leading words (a passphrase's, `prod-…`) are the value. The gateway
finds the placeholder by its exact bytes, so it must never occur by chance: at least
MIN_BITS of randomness, else the value is refused as too short to stand in for.
"""

from __future__ import annotations

import math
import string

MIN_BITS = 64
# the kinds of token whose leading word a tool checks (public: each names a service's
# token format, never anything of one token); the longest that a value starts with
KINDS = (
    "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "gldt-", "glrt-",
    "npm_", "pypi-", "hf_", "sk-", "sk-proj-", "sk-svcacct-", "sk-ant-", "sk-ant-api03-",
    "xoxb-", "xoxp-", "xoxa-", "xapp-", "dop_v1_", "shpat_", "lin_api_", "ntn_",
    "sk_live_", "sk_test_", "rk_live_", "rk_test_", "AIza", "SG.",
)  # fmt: skip
_HEX_LOWER = frozenset("0123456789abcdef")
_HEX_UPPER = frozenset("0123456789ABCDEF")


class TooShort(ValueError):
    """The value has too few letters and digits for a placeholder nobody could guess."""


def _alphabets(body: str) -> tuple[str, str, str]:
    """The lowercase, uppercase and digit alphabets the placeholder draws from: a hex
    token's letters stay hex letters."""
    chars = set(body) & set(string.ascii_letters + string.digits)
    lower = "abcdef" if chars and chars <= _HEX_LOWER else string.ascii_lowercase
    upper = "ABCDEF" if chars and chars <= _HEX_UPPER else string.ascii_uppercase
    return lower, upper, string.digits


def prefix(value: str) -> str:
    """The token's kind (of KINDS), kept as it is; empty for any other value."""
    kinds = [k for k in KINDS if value.startswith(k) and len(k) < len(value)]
    # the whole value is never a prefix: something must be left to draw
    return max(kinds, key=len, default="")


def bits(value: str) -> float:
    """The placeholder's randomness, in bits: each letter and digit after the prefix
    drawn from its alphabet."""
    kept = prefix(value)
    body = value[len(kept) :]
    lower, upper, digits = _alphabets(body)
    sizes = {"lower": len(lower), "upper": len(upper), "digit": len(digits)}
    return sum(math.log2(sizes[k]) for k in map(_class, body) if k in sizes)


def _class(ch: str) -> str:
    if not ch.isascii():
        return "other"
    if ch.islower():
        return "lower"
    if ch.isupper():
        return "upper"
    return "digit" if ch.isdigit() else "other"


def _draw(ch: str, alphabets: dict[str, str]) -> str:
    import secrets  # with a --secret only: it maps OpenSSL (hmac), which boxyd does not

    alphabet = alphabets.get(_class(ch))
    # punctuation (`_`, `-`, `.`, `/`, `+`, `=`) and anything not ASCII is the shape
    return secrets.choice(alphabet) if alphabet else ch


def make(value: str, *, taken: frozenset[str] = frozenset()) -> str:
    """A fresh placeholder for VALUE: never VALUE itself, nor one in TAKEN (another
    secret's, in the same session). Raises TooShort."""
    if bits(value) < MIN_BITS:
        raise TooShort(
            f"too few letters and digits for a placeholder of its shape (at least "
            f"{MIN_BITS} bits of randomness; it has {bits(value):.0f})"
        )
    kept = prefix(value)
    lower, upper, digits = _alphabets(value[len(kept) :])
    alphabets = {"lower": lower, "upper": upper, "digit": digits}
    while True:  # a repeat is ~2^-64: the loop is for correctness, not expected to turn
        drawn = kept + "".join(_draw(ch, alphabets) for ch in value[len(kept) :])
        if drawn != value and drawn not in taken and value not in drawn:
            return drawn


def same_shape(value: str, placeholder: str) -> bool:
    """What make() promises, as a check (the tests', and a guard on what a session
    is given back)."""
    kept = prefix(value)
    if len(value) != len(placeholder) or not placeholder.startswith(kept):
        return False
    lower, upper, digits = _alphabets(value[len(kept) :])
    alphabets = {"lower": lower, "upper": upper, "digit": digits}
    for a, b in zip(value[len(kept) :], placeholder[len(kept) :], strict=True):
        alphabet = alphabets.get(_class(a))
        if (b not in alphabet) if alphabet else (a != b):
            return False
    return True
