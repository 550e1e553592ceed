"""build_spec's environment step: the payload's environment from the -e and --secret
flags, the profile's env, env_pass and env_secrets (envpolicy builds it).

Pure but for REGISTRY, the resolver of the profile's env templates.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from boxy.errors import SecretsNeeded, UsageError
from boxy.request import RunOptions, secret_hosts
from boxyd.config import envpolicy, profiles
from boxyd.config.profiles import Registry
from boxyd.config.profileschema import Profile
from boxyd.net import hostsecrets
from boxyd.net.hostsecrets import HostSecret


def decide(
    o: RunOptions,
    prof: Profile,
    registry: Registry | None,
    *,
    client_env: Mapping[str, str],
    env_unset: Collection[str],
    home: str,
    user: str,
    notes: list[str],
    warnings: list[str] | None = None,
    stand_ins: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The payload's final environment. The client holds what the profile asks of its
    environment: what it did not send (ENV_UNSET: names it does not have) is asked
    for with SecretsNeeded, and the client sends it and asks again. STAND_INS: the
    placeholder the payload gets for a secret bound to hosts (host_secrets)."""
    check_sent(o, prof, client_env, env_unset)
    return envpolicy.sandbox_env(
        client_env,
        requested(o, notes if warnings is None else warnings, stand_ins),
        home=home,
        user=user,
        profile_env=profiles.resolve_env(prof.env, registry, source=prof.source, notes=notes),
        env_pass=prof.env_pass,
        notes=notes,
    )


def check_sent(
    o: RunOptions, prof: Profile, client_env: Mapping[str, str], env_unset: Collection[str]
) -> None:
    """Raise SecretsNeeded for the profile's env_secrets not given as --secret, and its
    env_pass names the client neither sent nor said it lacks."""
    sent = {secret.name for secret in o.secret}
    missing = list(dict.fromkeys(n for n in bindings(prof) if n not in sent))
    # env_pass reads the client's environment, which sends only a few names unasked
    unasked = [
        n
        for n in prof.env_pass
        if n not in client_env and n not in env_unset and not envpolicy.is_sensitive(n)
    ]
    if missing or unasked:
        raise SecretsNeeded(missing, prof.source, unasked)


def bindings(prof: Profile) -> dict[str, tuple[str, ...]]:
    """The profile's env_secrets by name: the hosts each is bound to (NAME@HOST), ()
    for one passed as it is. A name bound in any entry is bound to all their hosts:
    merged layers never loosen a binding."""
    out: dict[str, tuple[str, ...]] = {}
    for entry in prof.env_secrets:
        name, hosts = secret_hosts(entry)
        out[name] = tuple(dict.fromkeys(out.get(name, ()) + hosts))
    return out


def host_secrets(o: RunOptions, prof: Profile | None = None) -> list[HostSecret]:
    """--secret NAME@HOST and the profile's env_secrets NAME@HOST: each one's
    placeholder, made here (boxyd), the value kept beside it; the hosts checked again
    (they came over a wire). A name the profile binds stays bound even when the
    command line passes it plainly: the flag adds hosts, never the value itself."""
    bound = bindings(prof) if prof is not None else {}
    out: list[HostSecret] = []
    for secret in o.secret:
        hosts = tuple(dict.fromkeys((*secret.hosts, *bound.get(secret.name, ()))))
        if not hosts:
            continue
        envpolicy.check_name(secret.name, what="--secret")
        secret_hosts(f"{secret.name}@{','.join(hosts)}")  # raises UsageError
        try:
            out.append(
                hostsecrets.make(
                    secret.name, secret.value, hosts,
                    frozenset(s.placeholder for s in out),
                )
            )  # fmt: skip
        except ValueError as e:  # (its message never holds the value)
            raise UsageError(f"--secret {secret.name}@…: {e}") from None
    return out


def requested(
    o: RunOptions, said: list[str], stand_ins: Mapping[str, str] | None = None
) -> list[tuple[str, str | None]]:
    """-e NAME=VALUE and --secret NAME, in order, checked; -e NAME the client does not
    have (sent without a value) is skipped, said in one line (SAID): not refused, as
    docker does not, since a wrapper passes a variable that may be unset. A NAME given
    both ways is refused (the secret used to win, silently)."""
    secrets = {secret.name for secret in o.secret}
    for item in o.env:  # which one should win is not ours to guess: one line, exit 2
        if item.name in secrets:
            raise UsageError(
                f"-e {item.name}: {item.name} is also passed as a secret (--secret "
                f"{item.name}, or the profile's env_secrets); pass it one way"
            )
    out: list[tuple[str, str | None]] = []
    for item in o.env:
        if item.value is None:
            envpolicy.check_name(item.name)
            said.append(f"-e {item.name}: not set in your environment, so not passed")
            continue
        out.append((item.name, item.value))
    for secret in o.secret:
        envpolicy.check_name(secret.name, what="--secret")
        value = (stand_ins or {}).get(secret.name, secret.value)
        out.append((secret.name, envpolicy.check_value(secret.name, value, what="--secret")))
    return out
