"""A walk template whose parse children never return on a marked file: what a parser
that went superlinear on a hostile file would do (tests/integration/test_parse_apart.py
starts a boxyd with BOXY_WALK_MODULE naming this module). Everything else is the real
walk process: only parsedoor.run is wrapped, in this process and its children."""

from __future__ import annotations

import os

from boxyd.config import parsedoor
from boxyd.daemon import walkproc
from boxyd.stage2 import template

MARKER = b"BOXY-PARSE-NEVER-RETURNS"
_run = parsedoor.run


def _never_returns(job: parsedoor.Job) -> object:
    if MARKER in job.data:
        while True:  # a parse that never ends, holding this process's CPU (and GIL)
            pass
    return _run(job)


parsedoor.run = _never_returns

if __name__ == "__main__":
    os._exit(template.main(walkproc.child))
