"""widening.hold_back: every key in which an unapproved project's profile is wider
than the run's default is held back (and named); nothing narrower or equal is."""

from __future__ import annotations

from typing import Any

import pytest

from boxyd.config import widening
from boxyd.config.profileschema import Profile
from boxyd.config.runspec import CopyEntry, PathEntry

CACHE = "/home/u/.cache/boxy/cache/node/k"


def P(**kw: Any) -> Profile:
    return Profile(name="t", source="t", **kw)


def held(base: Profile, cand: Profile) -> tuple[Profile, list[str]]:
    out, keys = widening.hold_back(base, cand, own_cache=CACHE)
    return out, [str(k) for k in keys]


GENERIC = P(net="public")
NODE = P(
    net="allowlist",
    allow_hosts=["{npm_registry}"],
    memory=4 << 30,
    pids=1024,
    mkdir=[PathEntry(CACHE)],
    protect=[PathEntry("/w/.vscode", True)],
)


@pytest.mark.parametrize(
    "base_net,net,wider",
    [
        (None, "public", False),
        (None, "allowlist", False),
        (None, "none", False),
        ("public", "public", False),
        ("allowlist", "public", True),
        ("none", "public", True),
        ("none", "allowlist", True),
        ("allowlist", None, True),
        ("none", None, True),
        ("allowlist", "allowlist", False),
        ("allowlist", "none", False),
        ("none", "none", False),
    ],
)
def test_network_mode_is_ordered(base_net: str | None, net: str | None, wider: bool) -> None:
    out, keys = held(P(net=base_net), P(net=net))
    assert (keys != []) is wider
    if wider:
        assert keys == [f"net ({net or 'public'})"] and out.net == base_net
    else:
        assert out.net == net


def test_hosts_and_ports_widen_an_allowlist_only() -> None:
    base = P(net="allowlist", allow_hosts=["{npm_registry}"], allow_ports=[443])
    cand = P(
        net="allowlist",
        allow_hosts=["{npm_registry}", "evil.example", "*.evil.example"],
        allow_ports=[443, 22],
    )
    out, keys = held(base, cand)
    assert keys == ["allow_hosts (evil.example, *.evil.example)", "allow_ports (22)"]
    assert out.allow_hosts == ["{npm_registry}"] and out.allow_ports == [443]
    # against the public internet an allowlist of any hosts is narrower
    out, keys = held(GENERIC, cand)
    assert keys == [] and out.allow_hosts == cand.allow_hosts
    # held back to none: the hosts no longer matter
    out, keys = held(P(net="none"), cand)
    assert keys == ["net (allowlist)"] and out.net == "none"


def test_cidrs_are_covered_by_containment() -> None:
    base = P(allow_cidrs=["192.0.2.0/24", "2001:db8::/32"])
    cand = P(allow_cidrs=["192.0.2.7/32", "2001:db8:1::/48", "10.0.0.0/8", "192.0.0.0/16"])
    out, keys = held(base, cand)
    assert keys == ["allow_cidr (10.0.0.0/8, 192.0.0.0/16)"]
    assert out.allow_cidrs == ["192.0.2.7/32", "2001:db8:1::/48"]
    # no network: ranges are never used, so never held
    assert held(P(net="none"), P(net="none", allow_cidrs=["10.0.0.0/8"]))[1] == []


def test_tailscale_seccomp_tty() -> None:
    out, keys = held(GENERIC, P(tailscale=True, seccomp="compat", tty=True))
    assert keys == ["tailscale", "seccomp (compat)", "tty"]
    assert (out.tailscale, out.seccomp, out.tty) == (None, None, None)
    same = P(tailscale=True, seccomp="compat", tty=True)
    assert held(same, same)[1] == []
    assert held(same, P(seccomp="strict", tty=False))[1] == []


def test_an_unfiltered_terminal_is_held() -> None:
    out, keys = held(GENERIC, P(tty_raw=True))
    assert keys == ["tty_raw"] and out.tty_raw is None
    assert held(P(tty_raw=True), P(tty_raw=True))[1] == []
    assert held(GENERIC, P(tty_raw=False))[1] == []


@pytest.mark.parametrize("kind", ["ro", "rw", "mkdir", "reveal"])
def test_every_exposure_of_a_host_path_is_held(kind: str) -> None:
    cand = P(**{kind: [PathEntry("/home/u/.ssh"), PathEntry("/home/u/.aws", True)]})
    out, keys = held(GENERIC, cand)
    assert keys == [f"filesystem.{kind} (/home/u/.ssh, /home/u/.aws)"] and getattr(out, kind) == []


def test_exposure_the_base_grants_is_kept() -> None:
    base = P(rw=[PathEntry("/data")], ro=[PathEntry("/opt/x")], reveal=[PathEntry("/w/.env")])
    cand = P(
        ro=[PathEntry("/data"), PathEntry("/opt/x")],
        mkdir=[PathEntry("/data")],
        rw=[PathEntry("/opt/x")],
        reveal=[PathEntry("/w/.env")],
    )
    out, keys = held(base, cand)
    assert keys == ["filesystem.rw (/opt/x)"]  # read-only in the base: not writable
    assert [e.path for e in out.ro] == ["/data", "/opt/x"] and out.rw == []


def test_the_projects_own_cache_is_not_a_widening_but_another_projects_is() -> None:
    other = "/home/u/.cache/boxy/cache/node/other"
    cand = P(mkdir=[PathEntry(CACHE), PathEntry(CACHE + "/npm"), PathEntry(other)])
    out, keys = held(GENERIC, cand)
    assert keys == [f"filesystem.mkdir ({other})"]
    assert [e.path for e in out.mkdir] == [CACHE, CACHE + "/npm"]
    assert held(GENERIC, P(mkdir=[PathEntry(CACHE + "x")]))[1] != []  # a prefix is not inside


def test_copies_must_match_source_and_destination() -> None:
    base = P(copy=[CopyEntry("/h/a", "/h/a")], copy_ro=[CopyEntry("/h/b", "/h/b")])
    cand = P(
        copy=[
            CopyEntry("/h/a", "/h/a"),
            CopyEntry("/h/a", "/elsewhere"),
            CopyEntry("/h/b", "/h/b"),
        ],
        copy_ro=[
            CopyEntry("/h/a", "/h/a"),
            CopyEntry("/h/b", "/h/b"),
            CopyEntry("/h/.ssh/id", "/x"),
        ],
    )
    out, keys = held(base, cand)
    # a writable copy of what the base copies read-only is wider; the reverse is not
    assert keys == ["filesystem.copy (/h/a, /h/b)", "filesystem.copy_ro (/h/.ssh/id)"]
    assert out.copy == [CopyEntry("/h/a", "/h/a")]
    assert out.copy_ro == [CopyEntry("/h/a", "/h/a"), CopyEntry("/h/b", "/h/b")]


def test_a_protect_entry_of_the_base_is_never_dropped() -> None:
    base = P(protect=[PathEntry("/w/.vscode"), PathEntry("/w/.github")])
    out, keys = held(base, P(protect=[PathEntry("/w/.github"), PathEntry("/w/.idea")]))
    assert keys == ["filesystem.protect (/w/.vscode)"]
    assert {e.path for e in out.protect} == {"/w/.github", "/w/.idea", "/w/.vscode"}


def test_secrets_patterns_only_narrow() -> None:
    out, keys = held(P(secrets=["*.key"]), P(secrets=["*.key", "*.tok"]))
    assert keys == [] and out.secrets == ["*.key", "*.tok"]  # more covered: applies at once
    out, keys = held(P(secrets=["*.key", "*.pem"]), P(secrets=["*.tok"]))
    assert keys == ["filesystem.secrets (*.key, *.pem)"] and out.secrets == [
        "*.tok",
        "*.key",
        "*.pem",
    ]
    assert widening.approval_view({"filesystem": {"secrets": ["*.tok"]}}) == {"filesystem": {}}


def test_environment_from_the_host() -> None:
    base = P(env_pass=["TERM"], env_secrets=["NPM_TOKEN"])
    cand = P(
        env_pass=["TERM", "AWS_SECRET_ACCESS_KEY"],
        env_secrets=["NPM_TOKEN", "GH_TOKEN"],
        env={"ANYTHING": "set inside only"},
    )
    out, keys = held(base, cand)
    assert keys == ["env_pass (AWS_SECRET_ACCESS_KEY)", "env_secrets (GH_TOKEN)"]
    assert (out.env_pass, out.env_secrets) == (["TERM"], ["NPM_TOKEN"])
    assert out.env == {"ANYTHING": "set inside only"}


@pytest.mark.parametrize(
    "key,base_value,value,wider",
    [
        ("memory", None, 2 << 30, False),
        ("memory", None, (2 << 30) + 1, True),
        ("memory", 4 << 30, 1 << 30, False),
        ("memory", 1 << 30, None, True),
        ("pids", None, 512, False),
        ("pids", None, 513, True),
        ("pids", 100, None, True),
        ("cpus", None, 64.0, False),
        ("cpus", 1.0, 2.0, True),
        ("cpus", 1.0, None, True),
        ("timeout", None, 1e9, False),
        ("timeout", 60.0, 30.0, False),
        ("timeout", 60.0, None, True),
    ],
)
def test_limits_raised_or_lifted(
    key: str, base_value: float | None, value: float | None, wider: bool
) -> None:
    out, keys = held(P(**{key: base_value}), P(**{key: value}))
    assert keys == ([f"limits.{key}"] if wider else [])
    assert getattr(out, key) == (base_value if wider else value)


def test_node_asked_for_by_an_unapproved_file_keeps_the_default_limits() -> None:
    out, keys = held(GENERIC, NODE)
    assert keys == ["limits.memory", "limits.pids"]
    assert (out.net, out.allow_hosts, out.memory, out.pids) == (
        "allowlist",
        ["{npm_registry}"],
        None,
        None,
    )
    assert [e.path for e in out.mkdir] == [CACHE] and out.protect == NODE.protect
    assert held(NODE, NODE)[1] == []  # a profile is never wider than itself


def test_the_candidate_is_not_changed_in_place() -> None:
    cand = P(allow_hosts=["x"], net="allowlist")
    held(P(net="allowlist"), cand)
    assert cand.allow_hosts == ["x"]


def test_approval_view_leaves_out_only_what_cannot_widen() -> None:
    doc = {
        "profile": "node",
        "description": "d",
        "env": {"A": "1"},
        "net": "public",
        "limits": {"memory": "1GiB"},
        "filesystem": {"tmpfs": ["/opt/x"], "protect": ["a"], "ro": ["~/.ssh"]},
    }
    assert widening.approval_view(doc) == {
        "profile": "node",
        "net": "public",
        "limits": {"memory": "1GiB"},
        "filesystem": {"ro": ["~/.ssh"]},
    }


def test_a_published_port_is_held_unless_the_base_publishes_it() -> None:
    from boxy.values import parse_publish

    mine, other = parse_publish("8080:80"), parse_publish("9090:90")
    for net in ("public", "allowlist", "none"):  # every mode: the host's port is opened
        out, keys = held(P(net=net, ports=[mine]), P(net=net, ports=[mine, other]))
        assert keys == ["ports (127.0.0.1:9090:90)"] and out.ports == [mine]
