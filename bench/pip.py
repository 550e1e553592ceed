#!/usr/bin/env python3
"""`pip install -r requirements.txt` (a few small pure-Python packages) into a target
directory: outside the sandbox with a warm cache, against `boxyctl run --profile
python` with its project cache cold and warm, in the same run. Leaves the machine only
for the index pip is configured with.

Run as the user who will use boxy (not root): `.venv/bin/python bench/pip.py [-n 3]`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.npm import compare, registry_flags_for, start, timed  # noqa: E402
from bench.table import emit  # noqa: E402
from boxyd.config.registries import Registries  # noqa: E402

REQUIREMENTS = "six\nidna\ncertifi\ncharset-normalizer\nurllib3\nrequests\n"
PY = "/usr/bin/python3"


def ask(argv: list[str]) -> str | None:
    """A tool's answer, as boxyd's tool sandbox would give it (None if it failed)."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return r.stdout.strip() if r.returncode == 0 else None


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
        boxy = [
            str(BIN / "boxyctl"),
            "run",
            "--profile",
            "python",
            *registry_flags_for(hosts),
            "--",
            *install,
        ]
        fig = compare(
            f"pip install -r of {len(REQUIREMENTS.split())} packages",
            install,
            boxy,
            work,
            "python",
            n,
            "site",
            bench="pip",
        )
        emit([fig], as_json)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
