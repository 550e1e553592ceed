"""boxy.wirejson: json's own C encoder and scanner, without the json package's import
cost; what goes out and comes in is exactly what json.dumps and json.loads make of it."""

from __future__ import annotations

import json
import math

import pytest

from boxy import wirejson

DOCS = [
    {},
    [],
    "",
    0,
    -1.5e300,
    True,
    None,
    {"method": "dev.boxy.Manager.Run", "parameters": {"argv": ["sh", "-c", "echo 'é' \x01"]}},
    {"nested": [[[{"a": [1, 2.25, False, None, "\u2603", "\U0001f600"]}]]], "k": '\x00\n\t"'},
    {"1": 1, "": ""},
]


@pytest.mark.parametrize("doc", DOCS)
def test_the_same_text_as_json_dumps_and_back(doc: object) -> None:
    text = wirejson.dumps(doc)
    assert text == json.dumps(doc, separators=(",", ":"))
    assert wirejson.loads(text) == doc == wirejson.loads(text.encode())
    spaced = json.dumps(doc, indent=2)
    assert wirejson.loads(f" \n{spaced}\t\r\n") == json.loads(spaced)


def test_what_json_makes_of_the_odd_values() -> None:
    assert math.isnan(wirejson.loads("NaN")) and wirejson.loads("-Infinity") == -math.inf
    assert wirejson.dumps(math.inf) == "Infinity"
    assert wirejson.dumps({1: "a", None: "b"}) == json.dumps(
        {1: "a", None: "b"}, separators=(",", ":")
    )
    assert wirejson.loads('{"a":1,"a":2}') == {"a": 2}


@pytest.mark.parametrize(
    "bad",
    ["", " ", "{", '{"a":1} x', "[1,]", "{'a':1}", '"\x01"', "\ufeff{}", "nul", "01", b"\xff{}"],
)
def test_anything_but_one_document_is_a_value_error(bad: str | bytes) -> None:
    with pytest.raises(ValueError):  # as json refuses each
        json.loads(bad)
    with pytest.raises(ValueError):
        wirejson.loads(bad)


def test_what_json_cannot_hold_is_refused_as_json_refuses_it() -> None:
    with pytest.raises(TypeError, match="Object of type set is not JSON serializable"):
        wirejson.dumps({"a": {1}})
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        wirejson.dumps(loop)
    shared = [1]
    assert wirejson.dumps([shared, shared]) == "[[1],[1]]"  # a fresh encoder each call
    with pytest.raises(RecursionError):
        wirejson.loads("[" * 100_000)


def test_bad_text_is_a_value_error_where_json_was_never_imported() -> None:
    # the hook's process imports no json: 3.11's scanner then had no error to raise
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from boxy import wirejson\n"
        "assert 'json.decoder' not in sys.modules\n"
        "for bad in ('{', '[1,]', \"{'a':1}\", '\"\\x01\"', '01', '{\"a\" 1}'):\n"
        "    try:\n"
        "        wirejson.loads(bad)\n"
        "    except ValueError:\n"
        "        continue\n"
        "    raise SystemExit(f'no ValueError for {bad!r}')\n"
        "print(wirejson.loads('{\"ok\": [1]}'))\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    r = subprocess.run(
        [sys.executable, "-S", "-c", code, root], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "{'ok': [1]}"
