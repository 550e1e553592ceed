"""The architecture as the imports show it (docs/design.md, "Layers"): no cycle
between modules, and each layer imports only the layers below it.

    boxy  <-  kernel, net  <-  config  <-  plan, gitguard  <-  stage2  <-  daemon  <-  api  <-  boxyctl

Every import counts, a function-local or TYPE_CHECKING one too: a cycle kept alive
by an import inside a function is still a cycle. Stage 2 (a process of its own that
carries a plan out) imports nothing of the daemon's decisions: only boxy, the kernel
and network wrappers, and the plan's types.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("boxy", "boxyd", "boxyctl")

# (prefix, rank): the longest matching prefix names a module's layer
LAYERS = (
    ("boxy", 0),
    ("boxyd.kernel", 1),
    ("boxyd.net", 1),
    ("boxyd.config", 2),
    ("boxyd.plan", 3),
    ("boxyd.gitguard", 3),
    ("boxyd.stage2", 4),
    ("boxyd.daemon", 5),
    ("boxyd.api", 6),
    ("boxyd.daemon.serve", 6),  # the serving loop: wires the core to its adapters
    ("boxyd.__main__", 6),  # the process entry (python -m boxyd): starts the serving loop
    ("boxyctl", 7),
)
STAGE2_MAY_IMPORT = ("boxy", "boxyd.kernel", "boxyd.net", "boxyd.plan.ops", "boxyd.stage2")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The project's modules NAME imports (a package's __init__ counts only when it
    is what was imported: `from boxyd.plan import ops` imports boxyd.plan.ops)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            subs = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in MODULES]
            found.update(subs or [module])
    return {m for m in found if m in MODULES and m != name and not _is_empty_package(m)}


def _is_empty_package(name: str) -> bool:
    path = MODULES[name]
    return path.name == "__init__.py" and not path.read_text().strip()


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _rank(name: str) -> int:
    prefix, rank = max(
        ((p, r) for p, r in LAYERS if name == p or name.startswith(p + ".")),
        key=lambda pr: len(pr[0]),
    )
    return rank


def _cycle() -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(GRAPH[node]):
            if state.get(dep) == 1:
                return stack[stack.index(dep) :] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(GRAPH):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_is_read() -> None:
    # the control: the walk finds what is known to be imported
    assert "boxyd.plan.ops" in GRAPH["boxyd.stage2.rootfs"]
    assert "boxyd.config.runspec" in GRAPH["boxyd.plan.mountplan"]


def test_no_import_cycle() -> None:
    assert _cycle() is None, " -> ".join(_cycle() or [])


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_only_layers_below(name: str) -> None:
    upward = sorted(dep for dep in GRAPH[name] if _rank(dep) > _rank(name))
    assert not upward, f"{name} (layer {_rank(name)}) imports {upward}"


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m.startswith("boxyd.stage2")))
def test_stage2_imports_only_boxy_and_plan_types(name: str) -> None:
    def allowed(dep: str) -> bool:
        return any(dep == p or dep.startswith(p + ".") for p in STAGE2_MAY_IMPORT)

    assert not sorted(d for d in GRAPH[name] if not allowed(d))
