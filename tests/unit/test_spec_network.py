"""boxyd.config.network: build_spec's network step, pure over its inputs."""

from __future__ import annotations

from typing import Any

import pytest

from boxy.errors import UsageError
from boxy.request import RunOptions
from boxy.values import parse_host_spec, parse_publish
from boxyd.config import network
from boxyd.config.network import ProjectHosts
from boxyd.config.profileschema import Profile
from boxyd.config.projectregistries import ProjectRegistry

NPM = ProjectRegistry("/w/.npmrc", "registry", "https://mirror.test/", "npm_registry", "npm")
NPM_SCOPE = ProjectRegistry("/w/.npmrc", "@corp:registry", "https://corp.test/", None, "npm")
PIP_EXTRA = ProjectRegistry(
    "/w/venv/pip.conf", "global.extra-index-url", "https://extra.test/", None, "pip"
)

NO_PROJECT = ProjectHosts()


def prof(**kw: Any) -> Profile:
    return Profile(name="p", source="p.yaml", **kw)


def decide(
    o: RunOptions | None = None,
    p: Profile | None = None,
    registry: Any = None,
    project: ProjectHosts = NO_PROJECT,
) -> tuple[network.Network, list[str], list[str]]:
    notes: list[str] = []
    held: list[str] = []
    got = network.decide(o or RunOptions(), p or prof(), registry, project, notes=notes, held=held)
    return got, notes, held


def test_defaults_to_public_with_nothing_allowed() -> None:
    got, notes, held = decide()
    assert got == network.Network(
        "public", [], [], [], False, False, network.ASK_TIMEOUT, False, []
    )
    assert notes == held == []


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(UsageError) as e:
        decide(RunOptions(net="lan"))
    assert str(e.value) == "Run: options.net: expected public, allowlist or none"


def test_a_bad_host_is_refused() -> None:
    with pytest.raises(UsageError, match="--allow-host"):
        decide(RunOptions(allow_host=["bad host"]))


@pytest.mark.parametrize(
    ("flag", "hosts", "profile_net", "want"),
    [
        ("none", [], "public", "none"),  # the flag wins
        (None, ["a.test"], None, "allowlist"),  # hosts imply allowlist
        (None, ["a.test"], "public", "allowlist"),
        ("allowlist", ["a.test"], "none", "allowlist"),  # asked for: opens it
        (None, [], "none", "none"),  # the profile's
        (None, [], None, "public"),  # the default
    ],
)
def test_mode(flag: str | None, hosts: list[str], profile_net: str | None, want: str) -> None:
    assert network.mode(flag, hosts, prof(net=profile_net)) == want


@pytest.mark.parametrize("flag", ["public", "none"])
def test_allow_host_with_a_mode_that_has_no_list_is_refused(flag: str) -> None:
    assert network.mode(flag, ["a.test"], prof()) == flag  # the flag's mode, then refused:
    with pytest.raises(UsageError) as e:
        decide(RunOptions(net=flag, allow_host=["a.test"]))
    assert str(e.value) == (
        f"--allow-host: cannot be combined with --net {flag} (it implies allowlist)"
    )


def test_allow_host_with_a_profile_without_network_is_refused() -> None:
    with pytest.raises(UsageError) as e:
        network.mode(None, ["a.test"], prof(net="none"))
    assert str(e.value) == (
        "--allow-host: the profile p has no network (net: none); "
        "give --net allowlist as well to open one"
    )


def test_profile_hosts_unused_outside_allowlist_are_said() -> None:
    notes: list[str] = []
    assert network.profile_hosts("public", prof(allow_hosts=["a.test"]), None, [], notes) == []
    assert notes == ["profile p.yaml: allow_hosts not used with --net public"]
    notes.clear()
    assert network.profile_hosts("none", prof(), None, [], notes) == []
    assert notes == []


def test_profile_hosts_fill_their_templates() -> None:
    notes: list[str] = []
    p = prof(allow_hosts=["{npm_registry}", "{pip_index}", "b.test:8443"])
    got = network.profile_hosts("allowlist", p, {"npm_registry": "npm.test"}.get, [], notes)
    assert got == ["npm.test", "b.test:8443"]
    assert notes == ["profile p.yaml: allow_hosts {pip_index}: no {pip_index} configured; dropped"]


def test_an_allowlist_the_profile_could_not_fill_is_refused() -> None:
    p = prof(allow_hosts=["{npm_registry}"])
    with pytest.raises(UsageError) as e:
        network.profile_hosts("allowlist", p, None, [], [])
    assert str(e.value) == (
        "profile p: no host to allow: {npm_registry} could not be read from the tool's "
        "configuration (is the tool installed, and on your PATH?); name the host with "
        "--allow-host HOST"
    )
    # a host named on the command line is something to allow
    assert network.profile_hosts("allowlist", p, None, ["a.test"], []) == []
    # a profile that names none asks for none
    assert network.profile_hosts("allowlist", prof(), None, [], []) == []


def test_project_hosts_approved_are_added_for_the_tools_the_profile_reaches() -> None:
    project = ProjectHosts((NPM, NPM_SCOPE, PIP_EXTRA), trusted=True)
    assert network.project_hosts(project, ["{npm_registry}"], [], []) == ["corp.test"]
    both = ["{npm_registry}", "{pip_index}"]
    assert network.project_hosts(project, both, [], []) == ["corp.test", "extra.test"]
    assert network.project_hosts(project, ["a.test"], [], []) == []


def test_project_hosts_unapproved_are_held_back_and_named() -> None:
    project = ProjectHosts((NPM, NPM_SCOPE, PIP_EXTRA), trusted=False)
    held: list[str] = []
    # mirror.test is what the profile's template resolved to already: nothing held
    got = network.project_hosts(project, ["{npm_registry}"], ["mirror.test"], held)
    assert got == [] and held == ["@corp:registry corp.test of /w/.npmrc"]


def test_project_hosts_are_looked_at_only_for_an_allowlist() -> None:
    project = ProjectHosts((NPM_SCOPE,), trusted=False)
    p = prof(allow_hosts=["{npm_registry}"])
    got, _, held = decide(RunOptions(net="public"), p, project=project)
    assert got.allow_hosts == [] and held == []
    got, _, held = decide(RunOptions(net="allowlist"), p, {"npm_registry": "n.test"}.get, project)
    assert got.allow_hosts == ["n.test"] and held == ["@corp:registry corp.test of /w/.npmrc"]
    trusted = ProjectHosts((NPM_SCOPE,), trusted=True)
    got, _, _ = decide(RunOptions(net="allowlist"), p, {"npm_registry": "n.test"}.get, trusted)
    assert got.allow_hosts == ["n.test", "corp.test"]


def test_hosts_and_ports_are_the_profiles_then_the_flags_each_once() -> None:
    o = RunOptions(allow_host=["b.test", "a.test"], allow_port=[443, 22])
    got, _, _ = decide(o, prof(allow_hosts=["a.test"], allow_ports=[22, 80]))
    assert got.net == "allowlist"
    assert got.allow_hosts == ["a.test", "b.test"]
    assert got.allow_ports == [22, 80, 443]


@pytest.mark.parametrize("port", [0, 65536, -1])
def test_a_port_out_of_range_is_refused(port: int) -> None:
    with pytest.raises(UsageError) as e:
        decide(RunOptions(net="allowlist", allow_port=[port]))
    assert str(e.value) == f"--allow-port: {port!r} is not a port number (1–65535)"


def test_ranges_merge_outside_net_none() -> None:
    notes: list[str] = []
    p = prof(allow_cidrs=["192.168.0.0/16"], tailscale=True)
    got = network.ranges("public", p, ["172.16.0.0/12", "192.168.0.0/16"], False, notes)
    assert got == (["192.168.0.0/16", "172.16.0.0/12"], True)
    assert network.ranges("allowlist", prof(), [], False, notes) == ([], False)
    assert network.ranges("allowlist", prof(), [], True, notes) == ([], True)
    assert notes == []


def test_ranges_of_the_profile_do_not_apply_with_net_none() -> None:
    notes: list[str] = []
    p = prof(allow_cidrs=["192.168.0.0/16"], tailscale=True)
    assert network.ranges("none", p, [], False, notes) == ([], False)
    assert notes == [
        "profile p.yaml: allow_cidr not used with --net none",
        "profile p.yaml: tailscale not used with --net none",
    ]


def test_a_cidr_flag_is_parsed() -> None:
    got, _, _ = decide(RunOptions(allow_cidr=["192.168.4.0/24,fd12::/48"]))
    assert got.allow_cidrs == ["192.168.4.0/24", "fd12::/48"]
    with pytest.raises(UsageError, match="--allow-cidr"):
        decide(RunOptions(allow_cidr=["nope"]))


def test_ports_with_public_are_refused() -> None:
    with pytest.raises(UsageError) as e:
        decide(RunOptions(allow_port=[443]))
    assert str(e.value) == (
        "--allow-port: cannot be combined with --net public (public mode allows "
        "every port; the list applies to --net allowlist)"
    )


@pytest.mark.parametrize(
    ("flag", "options"),
    [
        ("--tailscale", {"tailscale": True}),
        ("--allow-port", {"allow_port": [22]}),
        ("--allow-cidr", {"allow_cidr": ["192.168.4.0/24"]}),
        ("--pcap", {"pcap": "/tmp/x.pcap"}),
        ("--net-log", {"net_log": "/tmp/x.log"}),
    ],
)
def test_network_flags_with_net_none_are_refused(flag: str, options: dict[str, Any]) -> None:
    with pytest.raises(UsageError) as e:
        decide(RunOptions(net="none", **options))
    assert str(e.value) == f"{flag}: cannot be combined with --net none (no network at all)"


def test_the_profiles_net_none_refuses_network_flags_as_the_flag_would() -> None:
    with pytest.raises(UsageError) as e:
        decide(RunOptions(pcap="/tmp/x.pcap"), prof(net="none"))
    assert str(e.value) == "--pcap: cannot be combined with --net none (no network at all)"


def test_pcap_max_needs_pcap() -> None:
    with pytest.raises(UsageError) as e:
        decide(RunOptions(pcap_max=10))
    assert str(e.value) == "--pcap-max: needs --pcap"


def test_the_profile_net_none_keeps_its_ranges_out_without_refusing() -> None:
    got, notes, _ = decide(RunOptions(), prof(net="none", tailscale=True))
    assert (got.net, got.tailscale) == ("none", False)
    assert notes == ["profile p.yaml: tailscale not used with --net none"]


def test_published_ports_come_from_the_profile_then_the_flags_in_every_mode() -> None:
    a, b = parse_publish("8080:80"), parse_publish("127.0.0.2:8080:81")
    for net in ("public", "allowlist", "none"):
        hosts = [parse_host_spec("example.test")] if net == "allowlist" else []
        o = RunOptions(net=net, allow_host=hosts, publish=[b, a])
        got, _, _ = decide(o, prof(ports=[a]))
        assert got.publish == [a, b]  # the profile's first, no repeat


def test_one_host_port_published_to_two_ports_is_refused() -> None:
    o = RunOptions(publish=[parse_publish("8080:81")])
    with pytest.raises(UsageError, match=r"--publish: 127\.0\.0\.1:8080 is published twice"):
        decide(o, prof(ports=[parse_publish("8080:80")]))
    # the same port on two host addresses is two mappings
    o = RunOptions(publish=[parse_publish("127.0.0.2:8080:80")])
    got, _, _ = decide(o, prof(ports=[parse_publish("8080:80")]))
    assert len(got.publish) == 2
