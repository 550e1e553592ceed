"""RunSpec: one run's request after the profile and the flags are merged and checked.

Built by ``build_spec`` from a client's RunRequest (boxy.request); everything downstream
(mount plan, seccomp, limits) reads only this. Pure: no I/O beyond reading the
profile file and stat()ing the paths it names.

Paths in ro/rw/mkdir are kept as given (absolute, normalised, not realpath'd):
each is mounted at that same path inside, and the kernel resolves the source
(so a profile's ~/.local/bin/claude symlink lands on the real binary). The
workdir and protect entries are realpath'd: they are located inside writable
trees by the mount code.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from boxy import options
from boxy.errors import BoxyError, ProfileError, SecretsNeeded, UsageError
from boxy.request import RunOptions, RunRequest

if TYPE_CHECKING:
    from boxyd.config.profiles import Profile
    from boxyd.config.projectconfig import Project


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
    secrets: list[str] = field(default_factory=list)  # filesystem.secrets: the user's own patterns
    mkdir: list[PathEntry] = field(default_factory=list)
    tmpfs: list[str] = field(default_factory=list)  # fresh writable dirs inside (profile)
    copy: list[CopyEntry] = field(default_factory=list)
    copy_ro: list[CopyEntry] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # the payload's final environment
    net: str = "none"  # public | allowlist | none
    allow_hosts: list[str] = field(default_factory=list)
    allow_ports: list[int] = field(default_factory=list)
    allow_cidrs: list[str] = field(default_factory=list)
    tailscale: bool = False
    memory: int = 2 << 30  # bytes
    pids: int = 512
    cpus: float | None = None
    timeout: float | None = None  # seconds
    audit_log: str | None = None
    net_log: str | None = None
    pcap: str | None = None
    pcap_max: int = 1 << 30
    seccomp: str = "strict"  # strict | compat
    tty: bool = False
    tty_raw: bool = False  # the payload's terminal output unfiltered (termfilter)
    verbose: bool = False
    detach: bool = False
    allow_git_write: bool = False
    # said to the user under -v (skipped optional entries …)
    notes: list[str] = field(default_factory=list)
    # said always, before the payload starts (what of .boxy.yaml was held back)
    warnings: list[str] = field(default_factory=list)


# --- building a RunSpec from the client's Run parameters -------------------------------

DEFAULT_PROFILE: str = options.default("profile")
DEFAULT_NET: str = options.default("net")  # a profile that leaves net unset gets this
# the host's system trees the sandbox sees, read-only (mountplan binds them)
SYSTEM_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# where a --copy cannot land: those, and what boxy builds read-only itself
READ_ONLY_TREES = (*SYSTEM_TREES, "/etc", "/proc", "/dev", "/sys")
MIN_MEMORY = 1 << 20  # the scratch tmpfs holds $HOME: below this nothing starts
MIN_PIDS = 8  # the sandbox's own init, the payload, a shell's children count too
DEFAULT_MEMORY: int = options.default("memory")
DEFAULT_PIDS: int = options.default("pids")
DEFAULT_PCAP_MAX: int = options.default("pcap_max")


def _contains(tree: str, path: str) -> bool:
    # "/".rstrip("/") + "/" is "/": the root contains every absolute path
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def _abs(path: str, base: str) -> str:
    return os.path.normpath(os.path.join(base, path))


def _dedupe(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def build_spec(
    request: RunRequest,
    *,
    uid: int,
    user: str,
    home: str,
    registry: Callable[[str], str | None] | None = None,
) -> RunSpec:
    """Merge a client's RunRequest with the profile and check them into a RunSpec.

    ``registry`` resolves the profile's host templates (npm_registry, pip_index, …)
    from the tools' own configuration. The profile defaults to ``generic``; flags
    add to the profile's lists and override its scalars; ``--allow-host`` without
    ``--net`` means allowlist. Reads the filesystem (stat, realpath, the profile)
    but changes nothing. Raises UsageError/ProfileError with one line.
    """
    # Imported here: stage 2 and the plan compiler import this module for the
    # dataclasses alone and must not pull in YAML.
    from boxy import values
    from boxy.paths import config_home
    from boxyd.config import caches, envpolicy, exposure, profiles, projectconfig, projectregistries

    argv, cwd, client_env, o = request.argv, request.cwd, request.client_env, request.options
    if not argv:
        raise UsageError("missing command (boxyctl run [flags] -- COMMAND [ARGS...])")
    if any("\0" in a for a in argv):
        raise UsageError("the command contains a NUL byte")
    notes: list[str] = []

    # The work directory, resolved once: every later containment check uses this form.
    workdir_flag = o.workdir
    raw_workdir = _abs(workdir_flag or cwd, cwd)
    workdir = os.path.realpath(raw_workdir)
    if not os.path.isdir(workdir):
        what = "--workdir" if workdir_flag else "the current directory"
        raise UsageError(f"{what} {raw_workdir}: not a directory")

    # The project's own configuration: the payload can write it, so only what is no
    # wider than the defaults applies until a person approves it (projectconfig)
    project = projectconfig.read(
        workdir, projectconfig.run_env(home, user, client_env), strict=False
    )
    trusted = not project.empty and projectconfig.is_trusted(project, config_home(home))
    held: list[str] = []  # said in one line once the network is known

    doc = _project_doc(project, trusted, held)
    named = doc.get("profile") if doc is not None else None
    profile_name = o.profile or named or DEFAULT_PROFILE
    profile_ref = profile_name
    if profiles.is_path(profile_name):
        if profile_name == "~" or profile_name.startswith("~/"):
            profile_ref = home + profile_name[1:]
        profile_ref = _abs(profile_ref, cwd)
    cache = caches.project_dir(home, profile_name, workdir)
    context = {"workdir": workdir, "home": home, "cache": cache}
    if doc is None:
        prof = profiles.load_profile(profile_ref, context=context)
    elif trusted:
        prof = profiles.project_layer(
            profiles.load_profile(profile_ref, context=context), doc, project.path, context
        )
        notes.append(f"{project.path}: approved; applied on top of profile {profile_name}")
    else:
        prof = _unapproved_layer(
            o.profile or DEFAULT_PROFILE, profile_ref, doc, project.path, context, held
        )
        profile_name = prof.name
    if trusted and project.registries:
        registry = projectregistries.resolver(registry, project.registries, client_env)
        notes.append(
            f"{workdir}: approved registries: "
            f"{', '.join(r.host or r.shown for r in project.registries)}"
        )
    src = prof.source
    for entry in prof.mkdir:  # the profile's package cache: boxy's own directory, made here
        if caches.is_cache(entry.path, home):
            try:
                caches.prepare(entry.path, workdir, home)
            except (OSError, BoxyError) as e:
                raise UsageError(
                    f"profile {src}: the package cache {entry.path}: {e}; "
                    "`boxyctl cache clean` removes it"
                ) from None

    spec = RunSpec(argv=list(argv), workdir=workdir, profile=profile_name, notes=notes)
    if project.unreadable is not None:  # said always: the payload may have planted it
        spec.warnings.append(f"{project.unreadable}, so it was not read")

    # --- network ---
    net_flag = o.net
    if net_flag is not None and net_flag not in profiles.NETS:
        raise UsageError("Run: options.net: expected public, allowlist or none")
    flag_hosts = [str(h) for h in o.allow_host]  # parsed once, as RunOptions came off the wire
    if flag_hosts and not net_flag and prof.net == "none":
        raise UsageError(
            f"--allow-host: the profile {prof.name} has no network (net: none); "
            "give --net allowlist as well to open one"
        )
    spec.net = net_flag or ("allowlist" if flag_hosts else None) or prof.net or DEFAULT_NET
    if spec.net == "allowlist":
        hosts = profiles.resolve_hosts(prof.allow_hosts, registry, source=src, notes=notes)
        if prof.allow_hosts and not hosts and not flag_hosts:  # never a silent empty allowlist
            raise UsageError(
                f"profile {prof.name}: no host to allow: {', '.join(prof.allow_hosts)} "
                "could not be read from the tool's configuration (is the tool "
                "installed, and on your PATH?); name the host with --allow-host HOST"
            )
    else:
        hosts = []
        if prof.allow_hosts:
            notes.append(f"profile {src}: allow_hosts not used with --net {spec.net}")
    if spec.net == "allowlist":
        hosts += _project_hosts(project, trusted, prof.allow_hosts, hosts, held)
    spec.allow_hosts = _dedupe(hosts + flag_hosts)
    if held:
        spec.warnings.append(
            f"{workdir}: not approved, so held back: {'; '.join(held)}; "
            f"`boxyctl trust` in {workdir} approves it"
        )
    ports = o.allow_port
    for port in ports:
        if not 1 <= port <= 65535:
            raise UsageError(f"--allow-port: {port!r} is not a port number (1–65535)")
    spec.allow_ports = _dedupe(prof.allow_ports + ports)
    flag_cidrs = [n for c in o.allow_cidr for n in values.parse_cidrs(c)]
    spec.tailscale = o.tailscale
    if spec.net == "none":  # the profile's network settings have nothing to apply to
        spec.allow_cidrs = flag_cidrs
        for key, given in (("allow_cidr", prof.allow_cidrs), ("tailscale", prof.tailscale)):
            if given:
                notes.append(f"profile {src}: {key} not used with --net none")
    else:
        spec.allow_cidrs = _dedupe(prof.allow_cidrs + flag_cidrs)
        spec.tailscale = o.tailscale or bool(prof.tailscale)
    options.check_combinations(o, net=spec.net)  # the client's checks, with the profile's net

    # --- filesystem ---
    labels: dict[tuple[str, str], str] = {}  # (kind, path) → what exposed it, for messages

    def check_paths(kind: str) -> list[PathEntry]:
        entries = [(f"profile {src}: filesystem.{kind}", e, True) for e in getattr(prof, kind)]
        entries += [(f"--{kind}", PathEntry(_abs(p, cwd)), False) for p in getattr(o, kind)]
        out: list[PathEntry] = []
        for label, entry, from_profile in entries:
            if any(e.path == entry.path for e in out):
                continue
            if kind == "mkdir":
                if os.path.exists(entry.path) and not os.path.isdir(entry.path):
                    raise _err(from_profile, f"{label} {entry.path}: exists and is not a directory")
            elif not os.path.exists(entry.path):
                if entry.optional:
                    notes.append(f"{label} {entry.path}: absent; skipped")
                    continue
                raise _err(from_profile, f"{label} {entry.path}: no such file or directory")
            labels[(kind, entry.path)] = label
            out.append(entry)
        return out

    spec.ro, spec.rw, spec.mkdir = check_paths("ro"), check_paths("rw"), check_paths("mkdir")
    for entry in spec.ro:
        if any(e.path == entry.path for e in spec.rw):
            raise UsageError(f"{entry.path}: exposed both read-only and read-write")
    writable = [workdir] + [os.path.realpath(e.path) for e in spec.rw + spec.mkdir]
    for entry in check_paths("protect"):
        if os.path.islink(entry.path) and entry.optional:  # a preset's tools' file
            # refused, not skipped: a symlink cannot be pinned, and one a payload planted
            # is exactly what the protection is for
            raise UsageError(
                f"profile {src}: {entry.path} is a symlink, which cannot be made "
                "read-only (an earlier run may have planted it); look at it and "
                "remove it"
            )
        if os.path.islink(entry.path):
            raise UsageError(f"--protect {entry.path}: is a symlink; name what it points to")
        real = os.path.realpath(entry.path)
        if not any(_contains(tree, real) for tree in writable) and entry.optional:
            # a preset's venv pip.conf through a .venv symlink to elsewhere: not writable
            # inside (the sandbox does not see where it points), so nothing to protect
            notes.append(f"protect {entry.path}: leads outside the writable trees; skipped")
            continue
        if not any(_contains(tree, real) for tree in writable):
            raise UsageError(
                f"--protect {entry.path}: not inside the work directory or a --rw path"
            )
        spec.protect.append(PathEntry(real, entry.optional))
    # lexical, not realpath'd: the entries they name are matched as the walk found them
    spec.reveal = _dedupe([e.path for e in prof.reveal] + [_abs(p, cwd) for p in o.reveal])
    spec.secrets = list(prof.secrets)

    exposed = [("workdir", workdir)]
    exposed += [
        (labels[k, e.path], e.path) for k in ("ro", "rw", "mkdir") for e in getattr(spec, k)
    ]
    exposure.check_exposed(exposed, exposure.sensitive_paths(client_env, home, uid))
    for label, path in exposed[1:]:
        exposure.refuse_sockets(label, path)

    copies = _check_copies(o, prof, cwd, home, notes)
    trees = [workdir] + [e.path for e in spec.ro + spec.rw + spec.mkdir]
    for label, entry in copies:
        for tree in trees:
            if _contains(tree, entry.dst):
                raise UsageError(
                    f"{label} {entry.src}:{entry.dst}: the destination lies inside the exposed "
                    f"path {tree}; a copy goes onto the sandbox's own tmpfs"
                )
        (spec.copy_ro if label.endswith("copy_ro") or label == "--copy-ro" else spec.copy).append(
            entry
        )

    spec.tmpfs = _check_tmpfs(prof, trees, home)

    # --- environment ---
    sent = {secret.name for secret in o.secret}
    missing = [n for n in prof.env_secrets if n not in sent]
    # env_pass reads the client's environment, which sends only a few names unasked
    unasked = [
        n
        for n in prof.env_pass
        if n not in client_env and n not in request.env_unset and not envpolicy.is_sensitive(n)
    ]
    if missing or unasked:  # the client holds them: it sends them and asks again
        raise SecretsNeeded(missing, src, unasked)
    requested: list[tuple[str, str | None]] = []
    for item in o.env:
        if item.value is None:
            envpolicy.check_name(item.name)
            notes.append(f"-e {item.name}: not set in your environment; skipped")
            continue
        requested.append((item.name, item.value))
    for secret in o.secret:
        envpolicy.check_name(secret.name, what="--secret")
        requested.append(
            (secret.name, envpolicy.check_value(secret.name, secret.value, what="--secret"))
        )
    spec.env = envpolicy.sandbox_env(
        client_env, requested, home=home, user=user,
        profile_env=profiles.resolve_env(prof.env, registry, source=src, notes=notes),
        env_pass=prof.env_pass, notes=notes,
    )  # fmt: skip

    # --- limits and the rest ---
    spec.memory = o.memory or prof.memory or DEFAULT_MEMORY
    spec.pids = o.pids or prof.pids or DEFAULT_PIDS
    if spec.memory < MIN_MEMORY:
        raise UsageError(
            f"--memory {values.format_size(spec.memory)}: below the minimum of 1MiB "
            "(a plain number is bytes: write 512MiB or 2GiB)"
        )
    if spec.pids < MIN_PIDS:
        raise UsageError(
            f"--pids {spec.pids}: below the minimum of {MIN_PIDS} (the sandbox's own "
            "init, the payload and its shell's children all count)"
        )
    spec.cpus = o.cpus or prof.cpus
    spec.timeout = o.timeout or prof.timeout
    if spec.cpus is not None:
        spec.cpus = float(spec.cpus)
    if spec.timeout is not None:
        spec.timeout = float(spec.timeout)
    seccomp = o.seccomp
    if seccomp is not None and seccomp not in profiles.SECCOMP_MODES:
        raise UsageError("Run: options.seccomp: expected strict or compat")
    spec.seccomp = seccomp or prof.seccomp or "strict"
    for key, flag in (("audit_log", "--audit-log"), ("net_log", "--net-log"), ("pcap", "--pcap")):
        value = getattr(o, key)
        if value is None:
            continue
        path = _abs(value, cwd)
        if not os.path.isdir(os.path.dirname(path)):
            raise UsageError(f"{flag} {path}: {os.path.dirname(path)} is not a directory")
        setattr(spec, key, path)
    spec.pcap_max = o.pcap_max or DEFAULT_PCAP_MAX
    spec.verbose, spec.allow_git_write = o.verbose, o.allow_git_write
    _terminal(spec, o, prof)
    return spec


def _terminal(spec: RunSpec, o: RunOptions, prof: Profile) -> None:
    """--tty, --tty-raw, -d. --tty-raw without a terminal is harmless (nothing is
    relayed, so nothing is filtered): accepted."""
    spec.tty, spec.detach = o.tty or bool(prof.tty), o.detach
    if spec.detach and spec.tty:
        raise UsageError(
            "--tty: cannot be combined with -d (a detached session has its own "
            "terminal; `boxyctl attach` takes it over)"
        )
    spec.tty_raw = o.tty_raw or bool(prof.tty_raw)
    if spec.tty_raw:
        spec.notes.append(
            f"{'--tty-raw' if o.tty_raw else f'profile {prof.source}: tty_raw'}: "
            "the payload's output reaches the terminal unfiltered (clipboard "
            "writes and queries included)"
        )


def _project_doc(project: Project, trusted: bool, held: list[str]) -> dict[str, Any] | None:
    """The parsed .boxy.yaml, or None when there is none or it is neither approved
    nor valid (then ignored whole, and said: the payload could have written it)."""
    from boxyd.config import profiles

    if project.config is None:
        return None
    try:
        return profiles.project_doc(project.text, project.path)
    except ProfileError as e:
        if trusted:
            raise
        held.append(f"{project.path}, which is not valid ({e})")
        return None


def _unapproved_layer(
    base_ref: str,
    profile_ref: str,
    doc: dict[str, Any],
    label: str,
    context: dict[str, str],
    held: list[str],
) -> Profile:
    """The profile an unapproved .boxy.yaml asks for, less everything in which it is
    wider than BASE_REF's (widening.hold_back); BASE_REF's profile when it does not
    load (said: nothing of an unapproved file may stop the run)."""
    from boxyd.config import profiles, widening

    # the base's {cache} is its own (the profile's name is in it), not the one in use
    base = profiles.load_profile(
        base_ref, context={k: v for k, v in context.items() if k != "cache"}
    )
    try:
        candidate = profiles.project_layer(
            profiles.load_profile(profile_ref, context=context), doc, label, context
        )
    except ProfileError as e:
        held.append(f"{label}, which does not load ({e})")
        base.name = base_ref
        return base
    prof, keys = widening.hold_back(base, candidate, own_cache=context["cache"])
    if keys:
        held.append(f"{', '.join(map(str, keys))} of {label}")
    return prof


def _project_hosts(
    project: Project, trusted: bool, allow_hosts: list[str], hosts: list[str], held: list[str]
) -> list[str]:
    """Hosts the project's .npmrc or pip.conf names, for a profile that reaches that
    tool's registry: added when approved, else named in HELD."""
    from boxyd.config import projectregistries

    families = {
        f for f, t in (("npm", "{npm_registry}"), ("pip", "{pip_index}")) if t in allow_hosts
    }
    named = [r for r in project.registries if r.family in families and r.host]
    if trusted:
        return projectregistries.extra_hosts(list(named), families)
    for r in named:
        if r.host not in hosts:
            held.append(f"{r.key} {r.host} of {r.source}")
    return []


def _check_tmpfs(prof: Any, trees: list[str], home: str) -> list[str]:
    """filesystem.tmpfs: each path on the sandbox's own tmpfs, never on a tree that
    is bound in (an exposed path, the system's read-only trees, /proc, /dev)."""
    out: list[str] = []
    for path in prof.tmpfs:
        label = f"profile {prof.source}: filesystem.tmpfs {path}"
        if path in (home, "/tmp", "/dev/shm"):
            raise ProfileError(f"{label}: already a fresh tmpfs")
        for tree in (*READ_ONLY_TREES, *trees):
            if _contains(tree, path) or _contains(path, tree):
                raise ProfileError(
                    f"{label}: overlaps {tree}, which is bound in; a tmpfs goes "
                    "on the sandbox's own filesystem (under $HOME, /tmp, /opt …)"
                )
        if path not in out:
            out.append(path)
    return out


def _err(from_profile: bool, message: str) -> UsageError:
    return ProfileError(message) if from_profile else UsageError(message)


def _check_copies(
    o: RunOptions, prof: Any, cwd: str, home: str, notes: list[str]
) -> list[tuple[str, CopyEntry]]:
    """Profile and flag copies, checked; a flag replaces a profile copy to the same
    destination (the seed's --copy other.json:$HOME/.claude.json)."""
    flagged: list[tuple[str, CopyEntry]] = []
    for items, flag in ((o.copy, "--copy"), (o.copy_ro, "--copy-ro")):
        for item in items:
            dst = item.dst
            src_path = _abs(item.src, cwd)
            if dst is not None and not dst.startswith("/"):
                raise UsageError(f"{flag} {item.src}:{dst}: the destination must be absolute")
            flagged.append((flag, CopyEntry(src_path, os.path.normpath(dst or src_path))))
    profiled = [(f"profile {prof.source}: filesystem.copy", e) for e in prof.copy]
    profiled += [(f"profile {prof.source}: filesystem.copy_ro", e) for e in prof.copy_ro]
    out: list[tuple[str, CopyEntry]] = []
    seen: dict[str, str] = {}
    for label, entry in flagged + profiled:
        from_profile = label.startswith("profile ")
        if entry.dst in seen:
            if from_profile and not seen[entry.dst].startswith("profile "):
                notes.append(f"{label} {entry.src}: replaced by {seen[entry.dst]} to {entry.dst}")
                continue
            raise _err(from_profile, f"{label} {entry.src}: a second copy to {entry.dst}")
        try:
            st = os.stat(entry.src)
        except OSError:
            if entry.optional:
                notes.append(f"{label} {entry.src}: absent; skipped")
                continue
            raise _err(from_profile, f"{label} {entry.src}: no such file or directory") from None
        if not stat.S_ISREG(st.st_mode):
            raise _err(from_profile, f"{label} {entry.src}: not a regular file")
        if not os.access(entry.src, os.R_OK):
            raise _err(from_profile, f"{label} {entry.src}: not readable by you")
        if entry.dst == "/":
            raise _err(from_profile, f"{label} {entry.src}:/: the destination must name a file")
        for tree in READ_ONLY_TREES:
            if _contains(tree, entry.dst):
                raise _err(
                    from_profile,
                    f"{label} {entry.src}:{entry.dst}: the destination lies on "
                    f"the sandbox's read-only {tree}; copy it under $HOME or /tmp",
                )
        seen[entry.dst] = label
        out.append((label, entry))
    return out
