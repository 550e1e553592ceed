"""build_spec: a client's RunRequest merged with the profile and checked into a RunSpec.

One step per concern, in the order their errors are said: the command and the work
directory, the profile (layering), the network, the filesystem, the environment,
the limits, logs and terminal. Each step returns RunSpec's fields of its concern
(same names); everything downstream (mount plan, seccomp, limits) reads only the
RunSpec (boxyd.config.runspec, which holds the types and defaults).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from boxy.errors import UsageError
from boxy.pathcheck import directory_problem, shown
from boxy.request import RunRequest
from boxyd.config import environment, filesystem, layering, limits, network
from boxyd.config.pathutil import absolute
from boxyd.config.profiles import Registry
from boxyd.config.runspec import RunSpec


def build_spec(
    request: RunRequest,
    *,
    uid: int,
    user: str,
    home: str,
    registry: Registry | None = None,
) -> RunSpec:
    """Merge a client's RunRequest with the profile and check them into a RunSpec.

    ``registry`` resolves the profile's host templates (npm_registry, pip_index, …)
    from the tools' own configuration. The profile defaults to ``generic``; flags
    add to the profile's lists and override its scalars; ``--allow-host`` without
    ``--net`` means allowlist. Reads the filesystem (stat, realpath, the profile)
    and makes only the profile's package cache. Raises UsageError/ProfileError with
    one line (SecretsNeeded when the client holds what the profile asks for).
    """
    o, cwd, client_env = request.options, request.cwd, request.client_env
    check_argv(request.argv)
    workdir = work_directory(o.workdir, cwd)
    notes: list[str] = []
    held: list[str] = []  # what of an unapproved project was held back: said in one line
    layers = layering.layer(
        o.profile, cwd=cwd, workdir=workdir, home=home, user=user,
        client_env=client_env, registry=registry, notes=notes, held=held,
    )  # fmt: skip
    prof, registry = layers.profile, layers.registry
    # the package cache is made as soon as the profile is known: its refusal comes first
    filesystem.prepare_caches(prof, workdir, home)
    project = network.ProjectHosts(layers.project.registries, layers.trusted)
    net = network.decide(o, prof, registry, project, notes=notes, held=held)
    warnings = layers.invalid + _warnings(layers.project.unreadable, held, workdir)
    fs = filesystem.decide(
        o, prof, cwd=cwd, workdir=workdir, home=home, uid=uid, client_env=client_env,
        notes=notes, warnings=warnings,
    )  # fmt: skip
    bound = environment.host_secrets(o, prof)
    env = environment.decide(
        o, prof, registry, client_env=client_env, env_unset=request.env_unset,
        home=home, user=user, notes=notes, warnings=warnings,
        stand_ins={s.name: s.placeholder for s in bound},
    )  # fmt: skip
    lim, logs = limits.limits(o, prof), limits.logs(o, cwd)
    term = limits.terminal(o, prof, notes)
    return RunSpec(
        argv=list(request.argv), workdir=workdir, profile=layers.name, env=env, host_secrets=bound,
        verbose=o.verbose, allow_git_write=o.allow_git_write, notes=notes, warnings=warnings,
        **_fields(net), **_fields(fs), **_fields(lim), **_fields(logs), **_fields(term),
    )  # fmt: skip


def _warnings(unreadable: str | None, held: list[str], workdir: str) -> list[str]:
    """Said always, before the payload starts: the project's files the run did not
    take (the payload may have planted them), in one line each."""
    out = [f"{unreadable}, so it was not read"] if unreadable is not None else []
    if held:
        out.append(
            f"{workdir}: not approved, so held back: {'; '.join(held)}; "
            f"`boxyctl trust` in {workdir} approves it"
        )
    return out


def check_argv(argv: list[str]) -> None:
    if not argv:
        raise UsageError("missing command (boxyctl run [flags] -- COMMAND [ARGS...])")
    if any("\0" in a for a in argv):
        raise UsageError("the command contains a NUL byte")


def work_directory(flag: str | None, cwd: str) -> str:
    """--workdir (or the client's cwd), realpath'd: every later containment check
    uses this form."""
    raw = absolute(flag or cwd, cwd)
    # before anything is recorded: a directory the user cannot read fails the walk, late
    problem = directory_problem(raw)
    if problem is not None:
        what = "--workdir" if flag else "the current directory"
        raise UsageError(f"{what} {shown(raw)}: {problem}")
    return os.path.realpath(raw)


def _fields(step: Any) -> dict[str, Any]:
    """A step's result as RunSpec keywords (its fields are named as RunSpec's; shallow:
    the entries are handed over, not copied)."""
    return {f.name: getattr(step, f.name) for f in dataclasses.fields(step)}
