"""Ask the host's own git what it would read in a directory — inside a sandbox.

The walk in discover.py models git's rules; this is the check that needs no model:
the same git binary the user will run later says which repository a directory
belongs to, which config files it reads there (every include resolved as git
resolves it), where it looks for hooks, and which gitlinks its index holds (where
``git status`` recurses). The scan then judges what git named.

git has no mode that runs nothing on a hostile repository: a sparse index whose
tree object is missing, with a promisor remote, makes even ``ls-files`` fetch
lazily through a planted ``uploadpack``. So git runs only in a tool sandbox
(boxyd/plan/tools.py: the tree read-only and not executable, no network, a deadline),
and what it prints is untrusted. Inside it, only plumbing that reads is run —
``rev-parse``, ``config --list``, ``ls-files`` — with nothing of the user's or the
system's configuration, no pager, no fsmonitor, no optional locks, no prompts, no
transport at all (``protocol.allow=never``: no lazy fetch), and a ceiling above the
tree so git never wanders out of it. Worst-case trust settings
(``safe.directory=*``, ``safe.bareRepository=all``) make it see every repository
any user's git could.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from boxyd.config.hosttools import Runner, ToolError
from boxyd.gitguard.gitconfig import Entry, split_key

TIMEOUT = 5.0  # seconds per git call
OUTPUT_MAX = 64 << 20

_FLAGS = (
    "--no-pager",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.untrackedCache=false",
    "-c",
    "safe.directory=*",
    "-c",
    "safe.bareRepository=all",
    "-c",
    "protocol.allow=never",  # the second layer: no fetch, lazy or not
)


class GitUnanswered(Exception):
    """git could not be asked, or its answer could not be read (timeout, odd paths)."""


@dataclass(frozen=True)
class Answer:
    gitdir: str  # absolute
    bare: bool
    hooks: str  # absolute: where git looks for hooks (core.hooksPath resolved by git)
    toplevel: str | None  # the work tree, when there is one
    config: tuple[tuple[str, Entry], ...] = ()  # (absolute origin file, entry)
    gitlinks: tuple[str, ...] = ()  # absolute paths of the index's gitlinks


def environment(home: str, ceiling: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,  # "~/" in an include means the user's home, as on the host
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_CEILING_DIRECTORIES": ceiling,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_PAGER": "cat",
        "PAGER": "cat",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_NO_LAZY_FETCH": "1",  # git >= 2.45 honours it; protocol.allow is the older layer
        "GIT_PROTOCOL_FROM_USER": "0",
    }


def _git(runner: Runner, cwd: str, env: dict[str, str], *args: str) -> tuple[int, bytes]:
    """Run git in CWD inside the tool sandbox RUNNER (the tree is there at its own path)."""
    try:
        answer = runner.run(
            ["git", *_FLAGS, *args], cwd=cwd, env=env, timeout=TIMEOUT, limit=OUTPUT_MAX
        )
    except ToolError as e:
        raise GitUnanswered(f"git {args[0]}: {e}") from e
    if answer.timed_out:
        raise GitUnanswered(f"git {args[0]} did not answer within {TIMEOUT:g}s")
    if answer.truncated:
        raise GitUnanswered(f"git {args[0]}: more than {OUTPUT_MAX >> 20} MiB of output")
    if answer.rc is None:
        raise GitUnanswered(f"git {args[0]} could not be run")
    return answer.rc, answer.out


def _absolute(base: str, path: str) -> str:
    return os.path.normpath(os.path.join(base, path))


def parse_rev_parse(out: bytes, cwd: str) -> Answer:
    """``rev-parse --absolute-git-dir --is-bare-repository --git-path hooks --show-toplevel``:
    four lines (three in a bare repository, where the last one fails)."""
    lines = os.fsdecode(out).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) not in (3, 4) or lines[1] not in ("true", "false"):
        raise GitUnanswered(
            "git rev-parse gave an answer that cannot be read (a newline in a path?)"
        )
    bare = lines[1] == "true"
    top = lines[3] if len(lines) == 4 else None
    if not lines[0].startswith("/") or (top is not None and not top.startswith("/")):
        raise GitUnanswered("git rev-parse gave a relative path")
    return Answer(gitdir=lines[0], bare=bare, hooks=_absolute(cwd, lines[2]), toplevel=top)


def parse_config_list(out: bytes, base: str) -> tuple[tuple[str, Entry], ...]:
    """``config --list --show-origin -z``: origin NUL key [LF value] NUL, repeated.
    A relative origin is relative to where git runs after setup (BASE). Entries from
    anything but a file (the command line: our own -c flags) are left out."""
    fields = out.split(b"\0")
    if fields and fields[-1] == b"":
        fields.pop()
    if len(fields) % 2:
        raise GitUnanswered("git config gave an answer that cannot be read")
    entries = []
    for origin, item in zip(fields[0::2], fields[1::2], strict=True):
        if not origin.startswith(b"file:"):
            continue
        key, nl, value = item.partition(b"\n")
        path = _absolute(base, os.fsdecode(origin[len(b"file:") :]))
        entries.append((path, split_key(os.fsdecode(key), os.fsdecode(value) if nl else None)))
    return tuple(entries)


def parse_gitlinks(out: bytes, top: str) -> tuple[str, ...]:
    """``ls-files -s -z --full-name``: "<mode> <oid> <stage>\\t<path>" NUL, repeated."""
    links = []
    for rec in out.split(b"\0"):
        meta, tab, path = rec.partition(b"\t")
        if tab and meta.startswith(b"160000 "):
            links.append(_absolute(top, os.fsdecode(path)))
    return tuple(links)


def ask(runner: Runner, cwd: str, env: dict[str, str]) -> Answer | None:
    """What git makes of the directory CWD (absolute); None when git finds no
    repository there."""
    rc, out = _git(
        runner,
        cwd,
        env,
        "rev-parse",
        "--absolute-git-dir",
        "--is-bare-repository",
        "--git-path",
        "hooks",
        "--show-toplevel",
    )
    if rc != 0 and out.count(b"\n") < 3:
        return None  # not a repository (or one git refuses: then the host's git does too)
    answer = parse_rev_parse(out, cwd)
    base = answer.toplevel or answer.gitdir
    rc, out = _git(runner, cwd, env, "config", "--list", "--show-origin", "-z")
    if rc != 0:
        raise GitUnanswered("git config --list failed (a config file git cannot parse?)")
    config = parse_config_list(out, base)
    links: tuple[str, ...] = ()
    if answer.toplevel is not None:
        rc, out = _git(runner, cwd, env, "ls-files", "-s", "-z", "--full-name", "--", ":/")
        if rc != 0:
            raise GitUnanswered("git ls-files failed (an index git cannot read?)")
        links = parse_gitlinks(out, answer.toplevel)
    return Answer(answer.gitdir, answer.bare, answer.hooks, answer.toplevel, config, links)
