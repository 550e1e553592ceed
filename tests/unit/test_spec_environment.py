"""boxyd.config.environment: build_spec's environment step, pure over its inputs."""

from __future__ import annotations

from typing import Any

import pytest

from boxy.errors import SecretsNeeded, UsageError
from boxy.request import EnvItem, RunOptions, Secret
from boxyd.config import environment
from boxyd.config.profileschema import Profile


def prof(**kw: Any) -> Profile:
    return Profile(name="p", source="p.yaml", **kw)


def decide(
    o: RunOptions,
    p: Profile,
    client_env: dict[str, str] | None = None,
    registry: Any = None,
    env_unset: tuple[str, ...] = (),
) -> tuple[dict[str, str], list[str]]:
    notes: list[str] = []
    env = environment.decide(
        o, p, registry, client_env=client_env or {}, env_unset=env_unset,
        home="/home/u", user="u", notes=notes,
    )  # fmt: skip
    return env, notes


def test_the_fixed_environment() -> None:
    env, notes = decide(RunOptions(), prof(), {"TERM": "xterm", "SECRET_TOKEN": "t", "X": "1"})
    assert env["HOME"] == "/home/u" and env["USER"] == env["LOGNAME"] == "u"
    assert env["TERM"] == "xterm" and "SECRET_TOKEN" not in env and "X" not in env
    assert notes == []


def test_flags_profile_env_and_env_pass_in_order_of_precedence() -> None:
    o = RunOptions(env=[EnvItem("A", "flag"), EnvItem("GONE", None)], secret=[Secret("S", "s")])
    p = prof(env={"A": "profile", "B": "{npm_registry_url}", "C": "{pip_cert}"}, env_pass=["P"])
    env, notes = decide(o, p, {"P": "passed"}, {"npm_registry_url": "https://n.test/"}.get)
    assert (env["A"], env["B"], env["P"], env["S"]) == ("flag", "https://n.test/", "passed", "s")
    assert "C" not in env and "GONE" not in env
    assert notes == [
        "-e GONE: not set in your environment, so not passed",
        "profile p.yaml: env C: no {pip_cert} configured; not set",
    ]


def test_what_the_profile_asks_of_the_client_is_asked_for() -> None:
    p = prof(env_secrets=["API_TOKEN"], env_pass=["NPM_EXTRA", "AWS_X", "HAVE", "UNSET"])
    with pytest.raises(SecretsNeeded) as e:
        decide(RunOptions(), p, {"HAVE": "1"}, env_unset=("UNSET",))
    # a sensitive env_pass name is never taken unasked: not asked for either
    assert (e.value.names, e.value.profile, e.value.passed) == (
        ["API_TOKEN"],
        "p.yaml",
        ["NPM_EXTRA"],
    )
    env, _ = decide(RunOptions(secret=[Secret("API_TOKEN", "t")]), prof(env_secrets=["API_TOKEN"]))
    assert env["API_TOKEN"] == "t"


def test_requested_refuses_a_bad_name_or_value() -> None:
    with pytest.raises(UsageError, match="not a valid variable name"):
        environment.requested(RunOptions(env=[EnvItem("1X", None)]), [])
    with pytest.raises(UsageError) as e:
        environment.requested(RunOptions(secret=[Secret("a-b", "v")]), [])
    assert str(e.value).startswith("--secret 'a-b': not a valid variable name")
    with pytest.raises(UsageError) as e:
        environment.requested(RunOptions(secret=[Secret("S", "a\0b")]), [])
    assert str(e.value) == "--secret S: the value contains a NUL byte"


def test_requested_keeps_the_order_given() -> None:
    notes: list[str] = []
    o = RunOptions(env=[EnvItem("B", "2"), EnvItem("A", None)], secret=[Secret("S", "s")])
    assert environment.requested(o, notes) == [("B", "2"), ("S", "s")]
    assert notes == ["-e A: not set in your environment, so not passed"]


@pytest.mark.parametrize("item", [EnvItem("TOK", "x"), EnvItem("TOK", None)])
def test_a_name_given_as_a_secret_and_with_e_is_refused(item: EnvItem) -> None:
    """`--secret TOK -e TOK=x` silently kept the secret (issue 33 §2); so did a
    profile's env_secrets, which the client sends as --secret."""
    with pytest.raises(UsageError) as e:
        decide(RunOptions(env=[item], secret=[Secret("TOK", "s")]), prof())
    assert str(e.value) == (
        "-e TOK: TOK is also passed as a secret (--secret TOK, or the profile's "
        "env_secrets); pass it one way"
    )
    p = prof(env_secrets=["TOK"])
    with pytest.raises(UsageError, match="-e TOK: TOK is also passed as a secret"):
        decide(RunOptions(env=[item], secret=[Secret("TOK", "s")]), p)


def test_a_profile_binds_a_secret_to_hosts() -> None:
    """env_secrets NAME@HOST is --secret NAME@HOST: the client is asked for NAME by its
    name alone, and the value it sends is bound to the profile's hosts."""
    p = prof(env_secrets=["GH@api.gh.example", "PLAIN"])
    with pytest.raises(SecretsNeeded) as e:
        decide(RunOptions(), p)
    assert e.value.names == ["GH", "PLAIN"]
    o = RunOptions(secret=[Secret("GH", "ghp_" + "a1" * 18), Secret("PLAIN", "p")])
    bound = environment.host_secrets(o, p)
    assert [(s.name, sorted(s.hosts)) for s in bound] == [("GH", ["api.gh.example"])]
    assert bound[0].placeholder != bound[0].value and len(bound[0].placeholder) == 40


def test_a_plain_flag_never_loosens_a_profile_binding() -> None:
    """--secret GH (no host) beside a profile's GH@HOST stays bound; a flag's own hosts
    add to the profile's; a name bound in one merged entry is bound in all."""
    p = prof(env_secrets=["GH", "GH@a.example", "GH@b.example"])
    assert environment.bindings(p) == {"GH": ("a.example", "b.example")}
    o = RunOptions(secret=[Secret("GH", "v" * 20, ("c.example",))])
    (only,) = environment.host_secrets(o, p)
    assert sorted(only.hosts) == ["a.example", "b.example", "c.example"]
    (plain,) = environment.host_secrets(RunOptions(secret=[Secret("GH", "v" * 20)]), p)
    assert sorted(plain.hosts) == ["a.example", "b.example"]
    assert environment.host_secrets(RunOptions(secret=[Secret("GH", "v" * 20)]), prof()) == []
