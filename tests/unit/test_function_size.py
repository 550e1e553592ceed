"""No function in product code over 60 lines (docs/design.md, "Code"): a reviewer
reads each step top to bottom. Counted from the `def` line to the last line of the
body, docstring and comments included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 60
PACKAGES = ("boxy", "boxyd", "boxyctl")


def _long_functions(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    out = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > LIMIT:
                        rel = path.relative_to(root)
                        out.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
    return out


def test_the_count_sees_a_long_function(tmp_path: Path) -> None:
    # the control: one line over the limit is found, the limit itself is not
    (tmp_path / "pkg").mkdir()
    for name, lines in (("long", LIMIT), ("fits", LIMIT - 1)):
        body = "\n".join(f"    x{i} = {i}" for i in range(lines))
        (tmp_path / "pkg" / f"{name}.py").write_text(f"def {name}():\n{body}\n")
    assert _long_functions(tmp_path, ("pkg",)) == [f"pkg/long.py:1 long: {LIMIT + 1} lines"]


def test_no_function_over_the_limit() -> None:
    assert not _long_functions(), "\n".join(_long_functions())
