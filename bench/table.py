"""One figure of a benchmark, with its target, and the table `make bench` prints.

Each bench script measures its reference in the same run and reports
``Figure``s; with ``--json`` it prints them as one JSON list on stdout (its prose
goes to stderr), which ``bench/all.py`` collects into one table.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Figure:
    """NAME measured as VALUE (in UNIT); RATIO against the reference measured in the
    same run (None when the figure is absolute); TARGET in words, MET whether it holds."""

    bench: str
    name: str
    value: float
    unit: str
    ratio: float | None
    target: str
    met: bool

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Figure:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})


# the target of a figure printed for what it tells, with nothing to meet
INFORMATION = "information"


def at_most(ratio: float, limit: float) -> tuple[float, str, bool]:
    return ratio, f"≤ {limit:g}×", ratio <= limit


def at_least(ratio: float, limit: float) -> tuple[float, str, bool]:
    return ratio, f"≥ {limit:g}×", ratio >= limit


def emit(figures: Sequence[Figure], as_json: bool) -> None:
    """The bench's result: JSON on stdout for bench/all.py, or the table."""
    if as_json:
        json.dump([f.to_json() for f in figures], sys.stdout)
        sys.stdout.write("\n")
    else:
        print(render(figures))


def _value(f: Figure) -> str:
    v = f.value
    text = f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return f"{text} {f.unit}".strip()


def render(figures: Iterable[Figure], before: dict[tuple[str, str], Figure] | None = None) -> str:
    """One row per figure: bench, figure, value, ratio, target, met; with BEFORE (the
    tree before, measured in the same run) its value and ratio too."""
    head = ["bench", "figure", "value", "ratio", "target", "met"]
    if before is not None:
        head[4:4] = ["before", "before ratio"]
    rows = [head]
    for f in figures:
        row = [
            f.bench,
            f.name,
            _value(f),
            "" if f.ratio is None else f"{f.ratio:.2f}×",
            f.target,
            "" if f.target == INFORMATION else "yes" if f.met else "NO",
        ]
        if before is not None:
            b = before.get((f.bench, f.name))
            row[4:4] = [
                "" if b is None else _value(b),
                "" if b is None or b.ratio is None else f"{b.ratio:.2f}×",
            ]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
