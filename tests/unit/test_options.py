"""boxy.options: the one table of `boxyctl run` options, checked entry by entry, and
everything read from it (the parser, RunOptions, the refused combinations on both
sides, the defaults)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import boxy
from boxy import options
from boxy.errors import UsageError
from boxy.options import RUN_OPTIONS, Option, check_combinations
from boxy.request import OPTIONS, RunOptions, RunRequest
from boxy.values import HostSpec, PortMapping, parse_host_spec
from boxyctl import cli, parser
from boxyd.config import profileschema, runspec, spec

ENV = {"HOME": "/home/u", "PATH": "/usr/bin"}
CWD = "/home/u/proj"
IDS = [o.flag for o in RUN_OPTIONS]

# The parser as it was before the table (flag names → argparse shape): the generated
# one takes exactly these.
OLD_FLAGS = {
    ("-p", "--profile"): "value", ("--ro",): "append", ("--rw",): "append",
    ("--protect",): "append", ("--reveal",): "append", ("--mkdir",): "append",
    ("--allow-git-write",): "true", ("--review",): "true", ("--edit-config",): "append", ("--allow-host-config",): "append", ("--copy",): "append", ("--copy-ro",): "append",
    ("-w", "--workdir"): "value", ("--net",): "value", ("--allow-host",): "append",
    ("--allow-port",): "append", ("--allow-cidr",): "append", ("--tailscale",): "true",
    ("--ask",): "true", ("--ask-timeout",): "value", ("--ask-notify",): "true",
    ("--publish",): "append",
    ("-e", "--env"): "append", ("--secret",): "append", ("--memory",): "value",
    ("--pids",): "value", ("--cpus",): "value", ("--timeout",): "value",
    ("--review-limit",): "value",
    ("--audit-log",): "value", ("--net-log",): "value", ("--pcap",): "value",
    ("--pcap-max",): "value", ("--seccomp",): "value", ("--tty",): "true",
    ("--tty-raw",): "true", ("-v", "--verbose"): "true", ("-d", "--detach"): "true",
}  # fmt: skip

# Every refusal the table lists, with the message the client and the daemon have always
# given (tests/unit/test_cli.py and test_spec.py assert parts of these too).
REFUSED = {
    "--allow-host: cannot be combined with --net none (it implies allowlist)",
    "--allow-host: cannot be combined with --net public (it implies allowlist)",
    "--allow-port: cannot be combined with --net public (public mode allows every port; "
    "the list applies to --net allowlist)",
    "--allow-port: cannot be combined with --net none (no network at all)",
    "--allow-cidr: cannot be combined with --net none (no network at all)",
    "--tailscale: cannot be combined with --net none (no network at all)",
    "--ask: cannot be combined with --net none (no network at all)",
    "--ask: cannot be combined with --net public (no name is refused to ask about)",
    "--ask-timeout: cannot be combined with --net none (no network at all)",
    "--ask-timeout: cannot be combined with --net public (no name is refused to ask about)",
    "--ask-notify: cannot be combined with --net none (no network at all)",
    "--ask-notify: cannot be combined with --net public (no name is refused to ask about)",
    "--net-log: cannot be combined with --net none (no network at all)",
    "--pcap: cannot be combined with --net none (no network at all)",
    "--pcap-max: needs --pcap",
}

# RunOptions' annotation for each wire kind (mypy reads the annotations; the table the rest)
ANNOTATION = {
    "str": "str | None", "strs": "list[str]", "hosts": "list[HostSpec]", "bool": "bool",
    "size": "int | None", "count": "int | None", "number": "float | None",
    "ports": "list[int]", "env": "list[EnvItem]", "secrets": "list[Secret]",
    "copies": "list[CopyItem]", "published": "list[PortMapping]",
}  # fmt: skip

# A value for each option that takes part in a refusal: (command line, wire value).
# Paths in the daemon's case are made to exist by the fixture ({wd}).
SAMPLES: dict[str, tuple[list[str], Any]] = {
    "allow_host": (["--allow-host", "a.example"], ["a.example"]),
    "allow_port": (["--allow-port", "22"], [22]),
    "allow_cidr": (["--allow-cidr", "192.168.4.0/24"], ["192.168.4.0/24"]),
    "tailscale": (["--tailscale"], True),
    "ask": (["--ask"], True),
    "ask_timeout": (["--ask-timeout", "30s"], 30.0),
    "ask_notify": (["--ask-notify"], True),
    "net_log": (["--net-log", "/tmp/n.json"], "{wd}/n.json"),
    "pcap": (["--pcap", "/tmp/c.pcap"], "{wd}/c.pcap"),
    "pcap_max": (["--pcap-max", "1GiB"], 1 << 30),
    "net": (["--net", "{value}"], "{value}"),
}


def _cases() -> list[tuple[Option, str, object, str]]:
    """(option, other field, other's value, message) for every refusal in the table."""
    out = []
    for option in RUN_OPTIONS:
        for refusal in option.refuses:
            for value in refusal.values:
                message = refusal.message.format(flag=option.flag, value=value)
                out.append((option, refusal.other, value, message))
    return out


CASES = _cases()
CASE_IDS = [c[3][:40] + f"[{c[2]}]" for c in CASES]


def _argv(field: str, value: object) -> list[str]:
    return [a.replace("{value}", str(value)) for a in SAMPLES[field][0]]


def _wire(field: str, value: object, wd: str) -> Any:
    got = SAMPLES[field][1]
    return got.replace("{value}", str(value)).replace("{wd}", wd) if isinstance(got, str) else got


# --- the table -------------------------------------------------------------------------


@pytest.mark.parametrize("option", RUN_OPTIONS, ids=IDS)
def test_every_option_has_a_flag_a_help_line_and_a_wire_field(option: Option) -> None:
    assert option.names and all(n.startswith("-") for n in option.names)
    assert option.flag.startswith("--") and all(len(n) == 2 for n in option.names[:-1])
    assert option.help and "{" not in option.help and "\n" not in option.help
    assert option.field in RunOptions.__slots__ and OPTIONS[option.field] == option.wire
    assert RunOptions.__annotations__[option.field] == ANNOTATION[option.wire]
    # how boxyctl reads its text: a switch has none, everything else a converter
    assert (option.type == "switch") == (option.kind == "true")
    assert option.type == "switch" or option.type in cli._CONVERT
    assert option.kind != "value" or option.choices or option.metavar
    assert (option.type == "choice") == (option.choices is not None)


def test_the_table_is_the_whole_wire_record() -> None:
    assert list(OPTIONS) == [o.field for o in RUN_OPTIONS] == list(RunOptions.__slots__)
    assert len({n for o in RUN_OPTIONS for n in o.names}) == sum(len(o.names) for o in RUN_OPTIONS)


@pytest.mark.parametrize("option", [o for o in RUN_OPTIONS if o.profile_key], ids=str)
def test_a_profile_key_is_one_profiles_read(option: Option) -> None:
    key = options.KEYS[str(option.profile_key)]
    assert key.field == option.field
    top, _, sub = key.path.partition(".")
    assert top in profileschema._TOP_KEYS
    if sub:
        assert (
            sub in {"filesystem": profileschema._FS_KEYS, "limits": profileschema._LIMIT_KEYS}[top]
        )


def test_every_profile_attribute_is_one_key_whose_columns_are_implemented() -> None:
    """Issue 32 §1: the table of profile keys is the one description of a key: the
    loader reads each by its CHECK, `extends` and .boxy.yaml merge each by its MERGE,
    and an unapproved .boxy.yaml is held back by each one's WIDEN rule."""
    from boxyd.config import profilemerge, widening

    attrs = [f.name for f in dataclasses.fields(profileschema.Profile)]
    assert sorted(k.attr for k in options.PROFILE_KEYS) == sorted(attrs[2:])  # name, source
    assert len(options.KEYS) == len(options.PROFILE_KEYS)
    for key in options.PROFILE_KEYS:
        assert callable(getattr(profileschema._Checker, key.check)), key
        assert key.shape in ("one", "list", "map"), key
        assert key.merge in profilemerge.MERGES, key
        assert key.widen in widening.RULES, key
        if key.widen in ("rank", "at_most") or key.check == "choice":
            assert key.field is not None, key  # its default and choices are its option's
        if key.widen == "rank":
            assert set(widening.RANKS[key.path]) == set(options.choices(str(key.field))), key
    assert set(widening.RULES) == {k.widen for k in options.PROFILE_KEYS}  # none unused


def test_defaults_are_written_once() -> None:
    """runspec's are the ones boxyd's modules import (widening, spec); the table's agree."""
    assert options.default("net") == runspec.DEFAULT_NET == "public"
    assert options.default("memory") == runspec.DEFAULT_MEMORY == 2 << 30
    assert options.default("pids") == runspec.DEFAULT_PIDS == 512
    assert options.default("pcap_max") == runspec.DEFAULT_PCAP_MAX == 1 << 30
    assert options.default("profile") == runspec.DEFAULT_PROFILE == "generic"
    assert profileschema.NETS == ("public", "allowlist", "none") == options.choices("net")
    assert profileschema.SECCOMP_MODES == ("strict", "compat") == options.choices("seccomp")
    # and the help lines show them as a user writes them
    helps = {o.field: o.help for o in RUN_OPTIONS}
    assert helps["memory"].endswith("(default 2GiB)") and helps["pids"].endswith("(default 512)")
    assert helps["pcap_max"].endswith("(default 1GiB)")
    assert helps["seccomp"].startswith("strict (default)") and "public without one" in helps["net"]
    with pytest.raises(KeyError):
        options.choices("memory")


# --- the parser from it ----------------------------------------------------------------


def _run_parser() -> argparse.ArgumentParser:
    top = parser.build_parser("boxyctl", run_only=True)
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["run"]  # type: ignore[no-any-return]


def test_the_generated_parser_takes_what_the_old_one_did() -> None:
    actions = {tuple(a.option_strings): a for a in _run_parser()._actions if a.option_strings}
    actions.pop(("-h", "--help"))
    assert actions.pop(("--report",)).dest == "report"  # the client's own, not in the table
    assert {k: ("true" if a.nargs == 0 else "append" if a.default == [] else "value")
            for k, a in actions.items()} == OLD_FLAGS  # fmt: skip
    for option in RUN_OPTIONS:
        action = actions[option.names]
        assert (action.dest, action.help) == (option.field, option.help)
        assert action.choices == option.choices


def test_every_flag_through_argparse_is_what_the_fast_path_builds() -> None:
    argv = [
        "-p", "node", "--ro", "/a", "--rw", "~/b", "--protect", "c", "--reveal", "d", "--mkdir", "e",
        "--allow-git-write", "--edit-config", "i", "--copy", "f", "--copy-ro", "g:/h", "-w", "../../..", "--net", "allowlist",
        "--allow-host", "x.example:22", "--allow-port", "80", "--allow-cidr", "192.168.4.0/24,fd12::/48",
        "--tailscale", "--publish", "[::1]:8080:80", "-e", "A=1", "--secret", "PATH",
        "--memory", "1GiB", "--pids", "64", "--cpus", "0.5", "--timeout", "1m", "--audit-log", "a", "--net-log", "n", "--pcap", "c.pcap",
        "--pcap-max", "1MiB", "--seccomp", "compat", "--tty", "--tty-raw", "-v", "-d", "--", "true",
    ]  # fmt: skip
    fast = cli.parse(["run", *argv], environ=ENV, cwd=CWD)
    slow = cli._parse_with_argparse(["run", *argv], environ=ENV, cwd=CWD, prog="boxyctl")
    assert fast == slow
    got = fast.args["request"].options
    assert got.allow_host == [HostSpec("x.example", (22,))]
    assert got.allow_cidr == ["192.168.4.0/24", "fd12::/48"]  # one value, two ranges
    assert got.publish == [PortMapping("::1", 8080, 80)]


def test_cli_and_parser_import_no_cycle() -> None:
    import ast

    src = Path(parser.__file__).read_text()
    imported = {
        n.module for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ImportFrom) and n.module
    }
    assert "boxyctl.cli" not in imported


def test_build_parser_is_short() -> None:
    import inspect

    assert len(inspect.getsource(parser.build_parser).splitlines()) <= 60


# --- the refused combinations ----------------------------------------------------------


def test_the_table_lists_every_refusal() -> None:
    assert {c[3] for c in CASES} == REFUSED
    assert all(o.field in SAMPLES for o, *_ in CASES)


@pytest.mark.parametrize("option,other,value,message", CASES, ids=CASE_IDS)
def test_refused_from_the_command_line(
    option: Option, other: str, value: object, message: str
) -> None:
    argv = _argv(option.field, value) + ([] if value is None else _argv(other, value))
    runs: tuple[Callable[[], object], ...] = (
        lambda: cli.parse(["run", *argv, "--", "true"], environ=ENV, cwd=CWD),
        lambda: cli._parse_with_argparse(
            ["run", *argv, "--", "true"], environ=ENV, cwd=CWD, prog="boxyctl"
        ),
    )
    for run in runs:
        with pytest.raises(UsageError) as e:
            run()
        assert str(e.value) == message


@pytest.mark.parametrize("option,other,value,message", CASES, ids=CASE_IDS)
def test_refused_from_the_wire(
    option: Option, other: str, value: object, message: str, tmp_path: Path
) -> None:
    """As the daemon sees it: RunOptions off the wire, then check_combinations, and
    build_spec itself."""
    home, wd = tmp_path / "home", tmp_path / "home" / "proj"
    wd.mkdir(parents=True)
    wire = {option.field: _wire(option.field, value, str(wd))}
    if value is not None:
        wire[other] = _wire(other, value, str(wd))
    request = RunRequest.from_wire({"argv": ["true"], "cwd": str(wd), "options": wire})
    with pytest.raises(UsageError) as e:
        check_combinations(request.options)
    assert str(e.value) == message
    with pytest.raises(UsageError) as e:
        spec.build_spec(request, uid=os.getuid(), user="u", home=str(home))
    assert str(e.value) == message


def test_the_daemon_checks_with_the_net_the_profile_gave() -> None:
    o = RunOptions(pcap="/w/c.pcap", allow_port=[22])
    check_combinations(o)  # no --net: the client cannot know
    with pytest.raises(UsageError, match="--allow-port: cannot be combined with --net none"):
        check_combinations(o, net="none")
    with pytest.raises(UsageError, match="--allow-port: cannot be combined with --net public"):
        check_combinations(o, net="public")
    check_combinations(RunOptions(allow_host=[HostSpec("a.example")]), net="allowlist")


def test_what_is_not_refused() -> None:
    for o in (
        RunOptions(net="allowlist", allow_host=[HostSpec("a")], allow_port=[22], pcap="/p"),
        RunOptions(net="public", allow_cidr=["192.168.4.0/24"], tailscale=True, net_log="/n"),
        RunOptions(pcap="/p", pcap_max=1),
        RunOptions(net="none", tty=True, detach=True),  # the daemon's own check, with the profile
    ):
        check_combinations(o)


# --- hosts: parsed once, typed across the wire -----------------------------------------


def test_a_host_crosses_the_wire_typed() -> None:
    o = RunOptions(allow_host=[parse_host_spec("NAS:22,80"), parse_host_spec("d.example:53/udp")])
    assert o.to_wire()["allow_host"] == ["nas:22,80", "d.example:53/udp"]
    back = RunOptions.from_wire(o.to_wire())
    assert back == o and back.allow_host == [
        HostSpec("nas", (22, 80)),
        HostSpec("d.example", (53,), True),
    ]
    with pytest.raises(UsageError, match="--allow-host: '1.2.3.4:': no port after"):
        RunOptions.from_wire({"allow_host": ["1.2.3.4:"]})
    with pytest.raises(UsageError, match="options.allow_host: expected a list of strings"):
        RunOptions.from_wire({"allow_host": [3]})


def test_a_host_spec_is_frozen_and_hashable() -> None:
    h = HostSpec("a.example", [443], False)  # type: ignore[arg-type]
    assert (
        h.ports == (443,)
        and h == HostSpec("a.example", (443,))
        and len({h, HostSpec("a.example", (443,))}) == 1
    )
    assert h != ("a.example", (443,), False)
    with pytest.raises(AttributeError):
        h.host = "b.example"
    assert repr(h) == "HostSpec(host='a.example', ports=(443,), udp=False)"


def test_a_host_given_as_text_is_parsed_once_into_its_type() -> None:
    # the Python library may hand RunOptions a host's text: it is typed all the same
    o = RunOptions(allow_host=["A.example:443", HostSpec("b.example")])
    assert o.allow_host == [HostSpec("a.example", (443,)), HostSpec("b.example")]
    with pytest.raises(UsageError, match="--allow-host a.example:0: '0' is not a port number"):
        RunOptions(allow_host=["a.example:0"])


def test_the_idl_declares_run_options_as_the_table_does() -> None:
    # the IDL's comments and types come from the table: regenerated, not hand-written
    text = (Path(boxy.__file__).parent / "dev.boxy.Manager.varlink").read_text()
    start, end = text.index(options.IDL_BEGIN), text.index(options.IDL_END)
    assert text[start : end + len(options.IDL_END)] + "\n" == options.idl_types()
    assert "  options: RunOptions," in text


def test_every_option_has_an_idl_type_and_the_server_checks_it() -> None:
    from boxyd.api import idl

    iface = idl.parse((Path(boxy.__file__).parent / "dev.boxy.Manager.varlink").read_text())
    run_options = iface.types["RunOptions"]
    assert [name for name, _ in run_options.fields or ()] == [o.field for o in options.RUN_OPTIONS]
    wire = RunOptions().to_wire()
    assert idl.check(iface, run_options, wire, "options") is None  # what boxyctl sends
    wire["memory"] = "2GiB"
    assert idl.check(iface, run_options, wire, "options") == "options.memory"
    assert idl.check(iface, run_options, {"nosuch": 1}, "options") == "options.nosuch"
