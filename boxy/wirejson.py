"""JSON for the varlink wire, through the json package's own C accelerator (_json).

The json package imports re (and with it the regular-expression compiler) to skip
whitespace and as its pure-Python fallback; that costs the client 5 ms of every run.
These are the very encoder and scanner json.dumps and json.loads use, called as they
call them: the same text out, the same values in, ValueError (JSONDecodeError is
one) for anything that is not one JSON document.
"""

from __future__ import annotations

import _json

TYPE_CHECKING = False  # typing costs the client 4 ms at start-up; annotations only
if TYPE_CHECKING:
    from typing import Any

_WHITESPACE = " \t\n\r"  # json.decoder.WHITESPACE
_CONSTANTS = {"-Infinity": -float("inf"), "Infinity": float("inf"), "NaN": float("nan")}


def _unserializable(o: object) -> object:
    """json.JSONEncoder.default: nothing beyond JSON's own types."""
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")


def dumps(obj: object) -> str:
    """json.dumps(OBJ, separators=(",", ":")). A fresh C encoder each time (cheap: it
    is json.JSONEncoder's Python set-up that json.dumps pays per call): its cycle
    markers are not left over from a call that failed half-way."""
    encode = _json.make_encoder(
        {}, _unserializable, _json.encode_basestring_ascii, None, ":", ",", False, False, True
    )
    return "".join(encode(obj, 0))


class _Context:
    """What the C scanner reads off a json.JSONDecoder(): its defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


_scan = _json.make_scanner(_Context())  # type: ignore[arg-type]  # a duck, as json's own


def loads(data: bytes | bytearray | str) -> Any:
    """json.loads(DATA) of UTF-8 bytes or text (no byte-order mark)."""
    text = data.decode("utf-8", "surrogatepass") if isinstance(data, bytes | bytearray) else data
    try:
        obj, end = _scan(text, _skip(text, 0))
    except StopIteration as e:
        raise ValueError(f"Expecting value: char {e.value}") from None
    except SystemError:
        # CPython 3.11's scanner raises its syntax errors as json.decoder's
        # JSONDecodeError, which it looks up in sys.modules only: not imported, it
        # fails without an exception. Imported now (only for text that is no JSON),
        # the same scan says what is wrong.
        import json.decoder  # noqa: F401

        obj, end = _scan(text, _skip(text, 0))
    if _skip(text, end) != len(text):
        raise ValueError(f"Extra data: char {end}")
    return obj


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WHITESPACE:
        i += 1
    return i
