#!/usr/bin/env python3
"""`pip install -r requirements.txt` (a few small pure-Python packages), outside the
sandbox with a warm cache against `boxyctl run --profile python` with its project
cache cold and warm, in the same run, in two forms:

- into a venv in the project (`.venv/bin/pip install -r`, the usual real form; the
  figure the 1.05x target is read against): each side's venv is made once before the
  rounds (inside: by a boxy run), so the figure is the install, not the venv's making;
  each round starts from the venv as it was made (what an install added removed);
- with `--target site` (information): pip installs into a temporary directory under
  TMPDIR and moves it into the target. Outside that is a rename; inside, /tmp is the
  sandbox's private tmpfs, so the move is a copy of every file across devices.

Leaves the machine only for the index pip is configured with.

Run as the user who will use boxy (not root): `.venv/bin/python bench/pip.py [-n 3]`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

BIN = Path(sys.executable).parent
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.npm import compare, registry_flags_for, start, timed  # noqa: E402
from bench.table import Figure, emit  # noqa: E402
from boxyd.config.registries import Registries  # noqa: E402

REQUIREMENTS = "six\nidna\ncertifi\ncharset-normalizer\nurllib3\nrequests\n"
PY = "/usr/bin/python3"


def ask(argv: list[str]) -> str | None:
    """A tool's answer, as boxyd's tool sandbox would give it (None if it failed)."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return r.stdout.strip() if r.returncode == 0 else None


def venv_reset(project: Path) -> Callable[[], None]:
    """Undo an install into PROJECT's .venv: every entry its site-packages and bin did
    not hold when the venv was made, removed, so the next install installs everything again."""
    dirs = [*project.glob(".venv/lib/python3*/site-packages"), project / ".venv" / "bin"]
    made = {d: set(os.listdir(d)) for d in dirs}

    def reset() -> None:
        for d, names in made.items():
            for name in set(os.listdir(d)) - names:
                path = d / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()

    return reset


def venv_form(n: int, box: list[str], what: str) -> Figure:
    """The venv form: a project of its own per side (neither side's walk sees the
    other's venv), each venv made once, one untimed install each (warm), then paired
    rounds."""
    sides = [Path(tempfile.mkdtemp(prefix=f"boxy-bench-pip-{s}-", dir=Path.home())) for s in "ab"]
    out, ins = sides
    try:
        for d in sides:
            (d / "requirements.txt").write_text(REQUIREMENTS)
        venv = [PY, "-m", "venv", ".venv"]
        timed(venv, out, ".venv")
        timed([*box, *venv], ins, ".venv")  # made in the sandbox, as the real job does
        resets = [venv_reset(d) for d in sides]
        install = [".venv/bin/pip", "install", "--no-input", "--disable-pip-version-check"]
        install += ["-r", "requirements.txt"]
        for d, reset in zip(sides, resets, strict=True):
            timed([*box, *install] if d is ins else install, d, reset)
        return compare(
            f"{what} into a venv",
            install,
            [*box, *install],
            ins,
            "python",
            n,
            resets[1],
            bench="pip",
            outside_at=(out, resets[0]),
        )
    finally:
        for d in sides:
            shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    n, work, as_json = start("pip")
    try:
        (work / "requirements.txt").write_text(REQUIREMENTS)
        install = [
            PY,
            "-m",
            "pip",
            "install",
            "--no-input",
            "--disable-pip-version-check",
            "--target",
            "site",
            "-r",
            "requirements.txt",
        ]
        timed(install, work, "site")  # warms the host's own cache
        # The bench's own tree is not hostile: pip is asked directly, not in a tool sandbox.
        reg = Registries(dict(os.environ), run=ask)
        hosts = [h for h in (reg("pip_index"), reg("pip_files")) if h]
        box = [str(BIN / "boxyctl"), "run", "--profile", "python", *registry_flags_for(hosts)]
        what = f"pip install -r of {len(REQUIREMENTS.split())} packages"
        figs = [venv_form(n, [*box, "--"], what)]
        figs.append(
            compare(
                f"{what} with --target (the move from TMPDIR)",
                install,
                [*box, "--", *install],
                work,
                "python",
                n,
                "site",
                bench="pip",
                target=None,
            )
        )
        emit(figs, as_json)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
