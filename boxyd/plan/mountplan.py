"""Compile a RunSpec into the stage-2 Plan: which trees, in which order, with which rights.

Pure apart from lstat()/readlink() of the host's system directories and the git
scan of writable trees (gitguard); stage 2 re-resolves every path safely itself.
"""

from __future__ import annotations

import base64
import functools
import grp
import os
import pwd
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from boxy import paths
from boxy.errors import UsageError
from boxyd.config.runspec import SYSTEM_TREES, RunSpec
from boxyd.plan.ops import (
    Bind,
    Copy,
    Dir,
    File,
    LandlockRule,
    Mask,
    MountOp,
    NetPlan,
    Overlay,
    Plan,
    Symlink,
)

if TYPE_CHECKING:
    from boxyd.gitguard.discover import Protection
    from boxyd.plan.masking import Found

HOSTNAME = "boxy"

# Read-only system trees. A symlink on the host (merged /usr) is recreated as a symlink.

# The only host files of /etc the sandbox sees: the dynamic linker's cache, TLS trust,
# the alternatives that /usr/bin links point through, time zone, service/protocol
# names. Never the host's whole /etc (passwd, shadow, the package managers' configs).
ETC_FROM_HOST = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "crypto-policies",
    "alternatives",
    "localtime",
    "timezone",
    "protocols",
    "services",
    "gai.conf",
    "mime.types",
    "inputrc",
    "bash.bashrc",
    "profile",
    "login.defs",
    "host.conf",
)

# Devices the payload may ioctl (Landlock IOCTL_DEV): terminals and the harmless nodes.
DEV_RULES = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/pts",
)


def _depth(path: str) -> int:
    return len([p for p in path.split("/") if p])


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def system_ops() -> tuple[list[MountOp], list[LandlockRule]]:
    ops: list[MountOp] = []
    rules: list[LandlockRule] = []
    for tree in SYSTEM_TREES:
        if os.path.islink(tree):
            ops.append(Symlink(dst=tree, target=os.readlink(tree)))
        elif os.path.isdir(tree):
            ops.append(Bind(src=tree, dst=tree, ro=True))
            rules.append(LandlockRule(tree, "ro"))
    for name in ETC_FROM_HOST:
        path = f"/etc/{name}"
        if os.path.lexists(path) and os.path.exists(path):
            ops.append(Bind(src=path, dst=path, ro=True, optional=True))
    rules.append(LandlockRule("/etc", "ro"))
    return ops, rules


def etc_files(
    uid: int, gid: int, user: str, home: str, net: str, search: str | None = None
) -> list[MountOp]:
    """A passwd and group holding only the user, and a resolver pointing at the gateway
    (SEARCH: a tailnet's domain, for its MagicDNS short names)."""
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = user
    resolv = (
        "# boxy: no network\n" if net == "none" else "nameserver 10.0.2.2\noptions edns0 trust-ad\n"
    )
    if search and net != "none":
        resolv += f"search {search}\n"
    return [
        File("/etc/passwd", f"{user}:x:{uid}:{gid}:{user}:{home}:/bin/sh\n"),
        File("/etc/group", f"{group}:x:{gid}:\n"),
        File("/etc/hostname", HOSTNAME + "\n"),
        File(
            "/etc/hosts",
            f"127.0.0.1\tlocalhost {HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        ),
        File(
            "/etc/nsswitch.conf",
            "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n"
            "networks: files\nprotocols: files\nservices: files\n",
        ),
        File("/etc/resolv.conf", resolv),
    ]


# --secret NAME@HOST: where the sandbox's bundle (the host's and the session CA) is,
# and the variables the runtimes read it from (each one the payload's -e did not set)
CA_BUNDLE = os.path.join(os.path.dirname(paths.SANDBOX_MARK), "ca-certificates.crt")
CA_VARIABLES = (
    "SSL_CERT_FILE",  # OpenSSL: Python's ssl, curl, wget, Ruby …
    "REQUESTS_CA_BUNDLE",  # requests (pip's vendored copy included)
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",  # node and npm: added to node's own store
    "AWS_CA_BUNDLE",
    "CARGO_HTTP_CAINFO",
    "DENO_CERT",
)


# Where the system's own bundle is, by distribution (Go's list, crypto/x509/root_linux.go):
# a program that reads no variable trusts the session CA there too
SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Gentoo, Arch
    "/etc/pki/tls/certs/ca-bundle.crt",  # Fedora, RHEL 6
    "/etc/ssl/ca-bundle.pem",  # openSUSE
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",  # RHEL 7+
    "/etc/ssl/cert.pem",  # Alpine
)


def trust_ops(net: NetPlan | None, env: dict[str, str]) -> tuple[list[MountOp], dict[str, str]]:
    """The session CA's bundle in the sandbox and the environment pointing at it."""
    if net is None or net.ca_bundle is None:
        return [], env
    pointed = {name: CA_BUNDLE for name in CA_VARIABLES}
    return [File(CA_BUNDLE, net.ca_bundle, 0o444)], {**pointed, **env}


def system_bundle_ops(net: NetPlan | None) -> list[MountOp]:
    """The same bundle grafted over each of the system's bundles that is a regular file
    under the /etc the sandbox binds (a symlink's target, where it is one): after the
    binds, which they lie on."""
    if net is None or net.ca_bundle is None:
        return []
    found = {os.path.realpath(p) for p in SYSTEM_BUNDLES if os.path.isfile(p)}
    bound = tuple(f"/etc/{name}/" for name in ETC_FROM_HOST)
    return [
        File(p, net.ca_bundle, 0o444, graft=True)
        for p in sorted(found)
        if p.startswith(bound) and not os.path.islink(p)
    ]


def writable_roots(spec: RunSpec) -> list[str]:
    """The trees the payload can write and will control between runs. Under --review a
    --rw or --mkdir tree inside the work directory is none: the overlay holds it with
    the rest of the work directory (overlaid)."""
    trees = [e.path for e in (*spec.rw, *spec.mkdir) if not overlaid(spec, spec.review, e.path)]
    roots = [spec.workdir, *trees]
    out: list[str] = []
    for r in sorted(set(roots), key=_depth):
        out.append(r)
    return out


def _based(path: str, roots: list[str]) -> tuple[str, str | None]:
    """(path relative to the innermost writable root containing it, that root) or
    (path, None) when no writable tree contains it."""
    best = None
    for r in roots:
        if _inside(path, r) and path != r and (best is None or len(r) > len(best)):
            best = r
    if best is None:
        return path, None
    return os.path.relpath(path, best), best


def _bind(
    path: str,
    roots: list[str],
    *,
    ro: bool,
    optional: bool = False,
    create: bool = False,
    in_place: bool = False,
) -> Bind:
    rel, base = _based(path, roots)
    return Bind(
        src=rel,
        dst=rel,
        ro=ro,
        src_base=base,
        dst_base=base,
        optional=optional,
        create=create,
        in_place=in_place,
    )


def overlaid(spec: RunSpec, held: bool, path: str) -> bool:
    """PATH, where a bind lands, lies in the work directory --review holds (HELD: the
    run is under review): a writable bind or a pin there is the
    overlay's own entry, never the host's, whoever asked for it (a --rw or --mkdir
    entry, a pin of the work directory's or of a writable tree around it). A host tree
    bound there sat over the overlay, and what the payload wrote in it reached the host
    unreviewed: `self` pins (a gitdir, the directories above a nested repository or a
    held file) are writable, and a --rw ~/parent's walk pins the work directory's own
    repository. (A --ro or --protect entry stays the host's: read-only, unwritable.)"""
    return held and _inside(os.path.normpath(path), spec.workdir)


def _pins(root: str, pins: list[Protection], held: Callable[[str], bool]) -> list[MountOp]:
    """The binds of ROOT's pins; each one HELD names (overlaid) binds the overlay's entry
    onto itself."""
    out: list[MountOp] = []
    for p in pins:
        if p.symlink:
            raise UsageError(
                f"{root}/{p.rel}: a protected git entry is a symlink (refused: it would be "
                "followed on the host); remove it, or run with --allow-git-write"
            )
        ro, in_place = p.kind == "ro", held(os.path.join(root, p.rel))
        out.append(Bind(p.rel, p.rel, ro, src_base=root, dst_base=root, in_place=in_place))
    return out


def user_ops(
    spec: RunSpec,
    protections: dict[str, list[Protection]],
    masks: dict[str, list[Found]] | None = None,
    review: tuple[str, str] | None = None,
) -> tuple[list[MountOp], list[LandlockRule]]:
    """Workdir (with REVIEW, the session's upper and work directories: an overlay),
    --ro, --rw and --mkdir, parents before children; then each writable
    tree's git protections, --protect entries and covered credentials on top (a
    credential's stand-in last: over .git/config it stacks on the pin); then copies."""
    roots = writable_roots(spec)
    entries: list[tuple[str, bool, bool, bool]] = [(spec.workdir, False, False, False)]
    entries += [(e.path, True, e.optional, False) for e in spec.ro]
    entries += [(e.path, False, e.optional, False) for e in spec.rw]
    entries += [(e.path, False, False, True) for e in spec.mkdir]
    ops: list[MountOp] = []
    rules: list[LandlockRule] = []
    seen: set[str] = set()
    held = functools.partial(overlaid, spec, review is not None)
    for path, ro, optional, create in sorted(entries, key=lambda e: _depth(e[0])):
        if path in seen:
            continue
        seen.add(path)
        # A writable tree is based on nothing above it: it is mounted whole from the host path.
        outer = [r for r in roots if r != path] if not ro else roots
        if review is not None and path == spec.workdir:
            ops.append(Overlay(dst=path, lower=path, upper=review[0], work=review[1]))
        else:  # (a held --mkdir: made in the overlay; a --ro one the host's, unwritable)
            in_place = not ro and held(path)
            ops.append(
                _bind(path, outer, ro=ro, optional=optional, create=create, in_place=in_place)
            )
        rules.append(LandlockRule(path, "ro" if ro else "rw"))
    for root in roots:
        ops += _pins(root, protections.get(root, []), held)
    for e in spec.protect:
        ops.append(_bind(e.path, roots, ro=True))
    for root in roots:
        for f in (masks or {}).get(root, []):
            ops.append(
                Mask(
                    dst=f.rel,
                    dst_base=root,
                    is_dir=f.is_dir,
                    content=base64.b64encode(f.content).decode(),
                )
            )
    exposed = [spec.workdir] + [e.path for e in (*spec.ro, *spec.rw, *spec.mkdir)]
    for c, ro in [(c, False) for c in spec.copy] + [(c, True) for c in spec.copy_ro]:
        for tree in exposed:
            if _inside(c.dst, tree):
                raise UsageError(
                    f"--copy{'-ro' if ro else ''} {c.src}:{c.dst}: the destination lies inside "
                    f"the exposed tree {tree}; copy it somewhere else (e.g. under $HOME)"
                )
        ops.append(Copy(src=c.src, dst=c.dst, ro=ro))
        rules.append(LandlockRule(c.dst, "ro" if ro else "rw"))
    return ops, rules


def build(
    spec: RunSpec,
    *,
    seccomp_bpf: bytes,
    protections: dict[str, list[Protection]],
    ctty: bool,
    masks: dict[str, list[Found]] | None = None,
    net: NetPlan | None = None,
    pty: dict[str, Any] | None = None,
    seccomp_notify: dict[str, Any] | None = None,
    review: tuple[str, str] | None = None,
) -> Plan:
    """The whole plan stage 2 applies, from the spec, the walk's pins and masks
    (PROTECTIONS, MASKS), the network's part (NET), the session terminal (PTY), the
    naming of refused calls (SECCOMP_NOTIFY), --review's upper and work directories
    (REVIEW): pure; nothing edits it after (design.md, "A run, step by step")."""
    uid, gid, pw = os.getuid(), os.getgid(), pwd.getpwuid(os.getuid())
    home = pw.pw_dir or f"/home/{pw.pw_name}"
    (sys_ops, sys_rules), (trust, env) = system_ops(), trust_ops(net, spec.env)
    u_ops, u_rules = user_ops(spec, protections, masks, review)
    ops: list[MountOp] = [
        Dir("/etc"),
        *etc_files(uid, gid, pw.pw_name, home, spec.net, net.search if net else None),
        File(paths.SANDBOX_MARK, paths.SANDBOX_NAME + "\n"),
        *trust,
        *sys_ops,
        *system_bundle_ops(net),  # (on the /etc binds among sys_ops)
        *u_ops,
    ]
    rules = _landlock(spec, home, sys_rules, u_rules)
    return Plan(
        argv=spec.argv,
        env=env,
        cwd=spec.workdir,
        uid=uid,
        gid=gid,
        home=home,
        hostname=HOSTNAME,
        scratch_size=spec.memory,
        ops=ops,
        landlock=rules,
        seccomp_bpf=base64.b64encode(seccomp_bpf).decode(),
        nproc=spec.pids,
        net=spec.net,
        **_net_fields(net),
        pty=pty,
        ctty=ctty,
        tmpfs=list(spec.tmpfs),
        **(seccomp_notify or {}),
    )


def _landlock(
    spec: RunSpec, home: str, sys_rules: list[LandlockRule], u_rules: list[LandlockRule]
) -> list[LandlockRule]:
    """What the payload may reach: the system's trees, the scratch, the user's trees."""
    return [
        LandlockRule("/", "dir"),
        *sys_rules,
        LandlockRule("/proc", "ro"),
        LandlockRule(os.path.dirname(paths.SANDBOX_MARK), "ro"),
        *(LandlockRule(d, "dev") for d in DEV_RULES),
        LandlockRule("/dev/shm", "rw"),
        LandlockRule("/tmp", "rw"),
        LandlockRule(home, "rw"),
        *(LandlockRule(p, "rw") for p in spec.tmpfs),
        *u_rules,
    ]


def _net_fields(net: NetPlan | None) -> dict[str, Any]:
    if net is None:
        return {"net_ruleset": None, "landlock_ports": None, "pcap": False}
    return {"net_ruleset": net.ruleset, "landlock_ports": net.landlock_ports, "pcap": net.pcap}
