"""RunSpec: one run's request after the profile and the flags are merged and checked.

Types and defaults only, no building (boxyd.config.spec builds one): the plan
compiler, stage 2's callers and the daemon import this module for the dataclasses
alone, so it imports nothing but the option table (no YAML, no profile code).

Paths in ro/rw/mkdir are kept as given (absolute, normalised, not realpath'd):
each is mounted at that same path inside, and the kernel resolves the source
(so a profile's ~/.local/bin/claude symlink lands on the real binary). The
workdir and protect entries are realpath'd: they are located inside writable
trees by the mount code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from boxy import options
from boxy.values import PortMapping
from boxyd.net.hostsecrets import HostSecret

# What a run gets when neither the flag nor the profile sets it: the option table's.
DEFAULT_PROFILE: str = options.default("profile")
DEFAULT_NET: str = options.default("net")  # a profile that leaves net unset gets this
DEFAULT_MEMORY: int = options.default("memory")
DEFAULT_REVIEW_LIMIT: int = options.default("review_limit")
DEFAULT_PIDS: int = options.default("pids")
DEFAULT_PCAP_MAX: int = options.default("pcap_max")
DEFAULT_SECCOMP: str = options.default("seccomp")
MIN_MEMORY = 1 << 20  # the scratch tmpfs holds $HOME: below this nothing starts
MIN_PIDS = 8  # the sandbox's own init, the payload, a shell's children count too
# the host's system trees the sandbox sees, read-only (mountplan binds them)
SYSTEM_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# where a --copy cannot land: those, and what boxy builds read-only itself
READ_ONLY_TREES = (*SYSTEM_TREES, "/etc", "/proc", "/dev", "/sys")


@dataclass
class PathEntry:
    path: str  # absolute host path (templates expanded, ~ expanded)
    optional: bool = False  # from a profile: skipped when absent (said under -v)


@dataclass
class CopyEntry:
    src: str  # absolute host path
    dst: str  # absolute path inside the sandbox
    optional: bool = False


@dataclass
class RunSpec:
    argv: list[str]
    workdir: str  # absolute host path, realpath'd; also the payload's cwd
    profile: str | None = None  # preset name or path, as given
    ro: list[PathEntry] = field(default_factory=list)
    rw: list[PathEntry] = field(default_factory=list)
    protect: list[PathEntry] = field(default_factory=list)
    reveal: list[str] = field(default_factory=list)  # credentials in the tree shown as they are
    # held files (plan/hostrun.py) this run may create or change: --edit-config
    edit_config: list[str] = field(default_factory=list)
    # writable trees that are or hold what host programs obey (config/hostconfig.py)
    allow_host_config: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)  # filesystem.secrets: the user's own patterns
    mkdir: list[PathEntry] = field(default_factory=list)
    tmpfs: list[str] = field(default_factory=list)  # fresh writable dirs inside (profile)
    # --review: the work directory an overlay whose upper layer is the session's (review.py)
    review: bool = False
    generated: list[str] = field(default_factory=list)  # listed, not diffed, by a review
    copy: list[CopyEntry] = field(default_factory=list)
    copy_ro: list[CopyEntry] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # the payload's final environment
    # --secret NAME@HOST: the values the gateway puts in requests to those hosts (the
    # payload's env holds their placeholders); never in a record (repr hides values)
    host_secrets: list[HostSecret] = field(default_factory=list)
    net: str = "none"  # public | allowlist | none
    allow_hosts: list[str] = field(default_factory=list)
    allow_ports: list[int] = field(default_factory=list)
    allow_cidrs: list[str] = field(default_factory=list)
    tailscale: bool = False
    ask: bool = False  # a name the allowlist does not hold is asked about (daemon/asking.py)
    ask_timeout: float = 60.0  # seconds a question waits for its answer
    ask_notify: bool = False  # questions nobody else answers: a desktop notification
    # reachable from the host at addr:host_port, relayed to the sandbox's loopback (publish.py)
    publish: list[PortMapping] = field(default_factory=list)
    memory: int = DEFAULT_MEMORY  # bytes
    pids: int = DEFAULT_PIDS
    cpus: float | None = None
    timeout: float | None = None  # seconds
    review_limit: int = DEFAULT_REVIEW_LIMIT  # bytes the --review layer may hold on disk
    audit_log: str | None = None
    net_log: str | None = None
    pcap: str | None = None
    pcap_max: int = DEFAULT_PCAP_MAX
    seccomp: str = DEFAULT_SECCOMP  # strict | compat
    tty: bool = False
    tty_raw: bool = False  # the payload's terminal output unfiltered (termfilter)
    verbose: bool = False
    detach: bool = False
    allow_git_write: bool = False
    # said to the user under -v (skipped optional entries …)
    notes: list[str] = field(default_factory=list)
    # said always, before the payload starts (what of .boxy.yaml was held back)
    warnings: list[str] = field(default_factory=list)
