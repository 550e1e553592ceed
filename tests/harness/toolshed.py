"""Real tool sandboxes for tests that run the git guard or the registry lookups
in-process: one stage-2 template per pytest process, started on the main thread
(whose death signal it follows), as boxyd starts its own."""

from __future__ import annotations

from boxyd.daemon.stage2proc import Template
from boxyd.daemon.toolbox import Toolshed

_template: Template | None = None


def opener(budget: float = 60.0) -> Toolshed:
    """A Toolshed over the shared template (started at the first call)."""
    global _template
    if _template is None:
        _template = Template()
        _template.start()
    return Toolshed(_template.spawn, budget)
