"""The plan's and the guard's jobs at the door to the parsers of what the payload
wrote (config/parsedoor.py; docs/design.md, "Nothing the payload wrote is parsed in
boxyd's process"): the credential scrubs, the tools' settings that run something,
package.json's scripts and git's config files, registered for the parse child, and
the typed helpers the walk, the end-of-run scan and the live guard call. A Hostile
verdict is passed through: each caller says what it means for its file."""

from __future__ import annotations

import json

from boxyd.config import parsedoor
from boxyd.config.parsedoor import Hostile, Job, Kind, as_list, as_pairs
from boxyd.gitguard import gitconfig
from boxyd.plan import credentials, toolconfig

__all__ = ["Hostile", "exec_settings", "git_config", "npm_scripts", "scrub"]


def _scrub(job: Job) -> bytes:
    return credentials.scrub(credentials.Rule(job.arg, credentials.Action.SCRUB, True), job.data)


def _exec(job: Job) -> list[list[str]]:
    return [list(p) for p in toolconfig.exec_settings(job.arg, job.data)]


# package.json's keys that run something: npm's scripts and config (its values reach
# the scripts), its bin (the commands an install links onto PATH: a global one shadows
# the user's), and what git hook managers read at each commit (husky 4,
# simple-git-hooks, lint-staged, pre-commit, yorkie's gitHooks; ghooks lives under config)
RUN_KEYS = (
    "scripts",
    "config",
    "bin",
    "husky",
    "simple-git-hooks",
    "lint-staged",
    "pre-commit",
    "gitHooks",
)


def _scripts(job: Job) -> bytes | None:
    """A package.json's keys that run something (RUN_KEYS) in one form; None where
    Python's json cannot read it (bad JSON, nested past the recursion limit, an int
    past 4300 digits): the caller compares it whole."""
    try:
        doc = json.loads(job.data)
        keys = {k: doc.get(k) for k in RUN_KEYS} if isinstance(doc, dict) else None
        return json.dumps(keys, sort_keys=True).encode()
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None


def _gitconfig(job: Job) -> dict[str, object]:
    parsed = gitconfig.parse(job.data)
    entries = [[e.section, e.subsection, e.name, e.value] for e in parsed.entries]
    return {"entries": entries, "complete": parsed.complete}


parsedoor.register(Kind.SCRUB, _scrub)
parsedoor.register(Kind.EXEC, _exec)
parsedoor.register(Kind.SCRIPTS, _scripts)
parsedoor.register(Kind.GITCONFIG, _gitconfig)


def scrub(rule: credentials.Rule, data: bytes) -> bytes | Hostile:
    got = parsedoor.parse(Job(Kind.SCRUB, rule.kind, data))
    return got if isinstance(got, (bytes, Hostile)) else Hostile("a scrub came back as no bytes")


def exec_settings(name: str, data: bytes) -> list[tuple[str, str]] | Hostile:
    got = parsedoor.parse(Job(Kind.EXEC, name, data))
    if isinstance(got, Hostile):
        return got
    try:
        return as_pairs(got)
    except (TypeError, ValueError):
        return Hostile("the settings came back in no shape")


def npm_scripts(data: bytes) -> bytes | None | Hostile:
    got = parsedoor.parse(Job(Kind.SCRIPTS, "", data))
    return got if got is None or isinstance(got, (bytes, Hostile)) else Hostile("no scripts")


def git_config(data: bytes) -> gitconfig.ParsedConfig | Hostile:
    got = parsedoor.parse(Job(Kind.GITCONFIG, "", data))
    if isinstance(got, Hostile):
        return got
    try:
        if not isinstance(got, dict) or not isinstance(got.get("complete"), bool):
            raise TypeError("not a parsed config")
        entries = tuple(gitconfig.Entry(*_entry(e)) for e in as_list(got.get("entries")))
    except (TypeError, ValueError):
        return Hostile("the entries came back in no shape")
    return gitconfig.ParsedConfig(entries, got["complete"])


def _entry(e: object) -> tuple[str, str | None, str, str | None]:
    fields = as_list(e)
    if len(fields) != 4 or not all(f is None or isinstance(f, str) for f in fields):
        raise ValueError("not an entry")
    section, subsection, name, value = fields
    if not isinstance(section, str) or not isinstance(name, str):
        raise ValueError("not an entry")
    return (
        section,
        subsection if isinstance(subsection, str) else None,
        name,
        (value if isinstance(value, str) else None),
    )
