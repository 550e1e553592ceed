"""build_spec's last steps: the limits and seccomp mode, where the run's logs go, and
the terminal. A flag overrides the profile's setting, which overrides the default.

Pure but for ``logs``, which checks that each log's directory exists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from boxy import values
from boxy.errors import UsageError
from boxy.request import RunOptions
from boxyd.config import profileschema
from boxyd.config.pathutil import absolute
from boxyd.config.profileschema import Profile
from boxyd.config.runspec import (
    DEFAULT_MEMORY,
    DEFAULT_PCAP_MAX,
    DEFAULT_PIDS,
    DEFAULT_REVIEW_LIMIT,
    DEFAULT_SECCOMP,
    MIN_MEMORY,
    MIN_PIDS,
)


@dataclass
class Limits:
    """RunSpec's limit fields (same names)."""

    memory: int
    pids: int
    cpus: float | None
    timeout: float | None
    review_limit: int
    seccomp: str


@dataclass
class Logs:
    """RunSpec's log fields (same names): absolute paths, or None."""

    audit_log: str | None
    net_log: str | None
    pcap: str | None
    pcap_max: int


@dataclass
class Terminal:
    """RunSpec's terminal fields (same names)."""

    tty: bool
    tty_raw: bool
    detach: bool


def limits(o: RunOptions, prof: Profile) -> Limits:
    """Memory (the scratch tmpfs), processes, cpus, the timeout, the seccomp mode."""
    memory = o.memory or prof.memory or DEFAULT_MEMORY
    pids = o.pids or prof.pids or DEFAULT_PIDS
    if memory < MIN_MEMORY:
        raise UsageError(
            f"--memory {values.format_size(memory)}: below the minimum of 1MiB "
            "(a plain number is bytes: write 512MiB or 2GiB)"
        )
    if o.memory is not None:
        check_memory_flag(o.memory)
    if pids < MIN_PIDS:
        raise UsageError(
            f"--pids {pids}: below the minimum of {MIN_PIDS} (the sandbox's own "
            "init, the payload and its shell's children all count)"
        )
    cpus = o.cpus or prof.cpus
    timeout = o.timeout or prof.timeout
    review_limit = o.review_limit or prof.review_limit or DEFAULT_REVIEW_LIMIT
    if o.review_limit is not None and not (o.review or prof.review):
        raise UsageError("--review-limit: needs --review (or a profile with review: true)")
    if review_limit < MIN_MEMORY:
        raise UsageError(
            f"--review-limit {values.format_size(review_limit)}: below the minimum of "
            "1MiB (a plain number is bytes: write 512MiB or 2GiB)"
        )
    if o.seccomp is not None and o.seccomp not in profileschema.SECCOMP_MODES:
        raise UsageError("Run: options.seccomp: expected strict or compat")
    return Limits(
        memory=memory,
        pids=pids,
        cpus=float(cpus) if cpus is not None else None,
        timeout=float(timeout) if timeout is not None else None,
        review_limit=review_limit,
        seccomp=o.seccomp or prof.seccomp or DEFAULT_SECCOMP,
    )


def machine_memory() -> int | None:
    """The machine's physical memory in bytes, or None when the kernel does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def check_memory_flag(memory: int) -> None:
    """Refused: a --memory above the machine's memory limits nothing (the host runs out
    first), so the bound asked for cannot be kept. A profile's value is not checked:
    a profile is shared between machines of different sizes."""
    total = machine_memory()
    if total is not None and memory > total:
        raise UsageError(
            f"--memory {values.format_size(memory)}: more than this machine's "
            f"{values.format_size(total)} of memory, so it would limit nothing; "
            "give less, or leave it out for the default"
        )


def logs(o: RunOptions, cwd: str) -> Logs:
    """--audit-log, --net-log, --pcap against CWD, each in a directory that exists
    (--pcap-max without --pcap: options.check_combinations refuses it)."""
    paths: dict[str, str | None] = {}
    for key, flag in (("audit_log", "--audit-log"), ("net_log", "--net-log"), ("pcap", "--pcap")):
        value = getattr(o, key)
        path = absolute(value, cwd) if value is not None else None
        if path is not None and not os.path.isdir(os.path.dirname(path)):
            raise UsageError(f"{flag} {path}: {os.path.dirname(path)} is not a directory")
        paths[key] = path
    return Logs(
        audit_log=paths["audit_log"],
        net_log=paths["net_log"],
        pcap=paths["pcap"],
        pcap_max=o.pcap_max or DEFAULT_PCAP_MAX,
    )


def terminal(o: RunOptions, prof: Profile, notes: list[str]) -> Terminal:
    """--tty, --tty-raw, -d. --tty-raw without a terminal is harmless (nothing is
    relayed, so nothing is filtered): accepted."""
    tty, detach = o.tty or bool(prof.tty), o.detach
    if detach and tty:
        raise UsageError(
            "--tty: cannot be combined with -d (a detached session has its own "
            "terminal; `boxyctl attach` takes it over)"
        )
    tty_raw = o.tty_raw or bool(prof.tty_raw)
    if tty_raw:
        notes.append(
            f"{'--tty-raw' if o.tty_raw else f'profile {prof.source}: tty_raw'}: "
            "the payload's output reaches the terminal unfiltered (clipboard "
            "writes and queries included)"
        )
    return Terminal(tty=tty, tty_raw=tty_raw, detach=detach)
