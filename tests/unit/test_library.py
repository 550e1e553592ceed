"""The library's keywords and values (boxy.library.run_options): the option table's
fields, values read as the flags' are (the same UsageError), and `import boxy`
staying cheap: the library loads on first use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import boxy
from boxy import values
from boxy.errors import UsageError
from boxy.library import run_options
from boxy.options import BY_FIELD, RUN_OPTIONS, Option
from boxy.values import HostSpec
from boxyctl import cli

ROOT = Path(__file__).resolve().parents[2]


def test_import_boxy_loads_no_library_module() -> None:
    code = (
        "import sys, boxy; print(' '.join(sorted(m for m in sys.modules if m.startswith('boxy'))));"
        "boxy.run; print(' '.join(sorted(m for m in sys.modules if m == 'boxy.library')))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    cheap, loaded = out.stdout.splitlines()
    assert cheap.split() == ["boxy", "boxy.ident"]
    assert loaded == "boxy.library"


def test_the_package_names_the_library_and_the_errors() -> None:
    assert boxy.NoSuchSession is __import__("boxy.errors").errors.NoSuchSession
    assert callable(boxy.spawn_pty) and boxy.PIPE == -1
    with pytest.raises(AttributeError):
        boxy.nothing_like_this  # noqa: B018
    assert "spawn_pty" in dir(boxy)


def test_keywords_are_the_table_fields_and_the_plural_aliases() -> None:
    o = run_options(
        {"allow_hosts": ["example.com:443"], "allow_ports": 8443, "memory": 1 << 20,
         "timeout": "10m", "cpus": 0.5, "pids": "64", "net": "allowlist", "tty_raw": True,
         "env": {"A": "1"}, "secrets": {"TOKEN": "s3"}, "ro": "/usr", "copy": ("/etc/hosts", "/x")},
        "run",
    )  # fmt: skip
    assert o.allow_host == [HostSpec("example.com", (443,))]
    assert o.allow_port == [8443] and o.memory == 1 << 20 and o.timeout == 600.0
    assert o.cpus == 0.5 and o.pids == 64 and o.tty_raw is True
    assert [(e.name, e.value) for e in o.env] == [("A", "1")]
    assert [(s.name, s.value) for s in o.secret] == [("TOKEN", "s3")]
    assert o.ro == ["/usr"] and (o.copy[0].src, o.copy[0].dst) == ("/etc/hosts", "/x")


def test_paths_are_absolute_against_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "/home/me")
    o = run_options({"rw": ["sub", "~/x"], "workdir": ".", "profile": "p.yaml"}, "run")
    assert o.rw == [str(tmp_path / "sub"), "/home/me/x"]
    assert o.workdir == str(tmp_path) and o.profile == str(tmp_path / "p.yaml")


@pytest.mark.parametrize(
    "kw", [{"bogus": 1}, {"detach": True}, {"allow_host": [], "allow_hosts": []}]
)
def test_an_unknown_keyword_is_a_type_error(kw: dict[str, object]) -> None:
    with pytest.raises(TypeError):
        run_options(kw, "run")


@pytest.mark.parametrize(
    ("kw", "flags"),
    [
        ({"memory": "2X"}, ["--memory", "2X"]),
        ({"pids": "many"}, ["--pids", "many"]),
        ({"timeout": "soon"}, ["--timeout", "soon"]),
        ({"allow_hosts": ["bad host"]}, ["--allow-host", "bad host"]),
        ({"allow_ports": [70000]}, ["--allow-port", "70000"]),
        ({"net": "none", "allow_hosts": ["example.com"]}, ["--net", "none", "--allow-host", "example.com"]),
        ({"net": "public", "allow_ports": [22]}, ["--net", "public", "--allow-port", "22"]),
        ({"pcap_max": "1MiB"}, ["--pcap-max", "1MiB"]),
        ({"env": ["1A=x"]}, ["-e", "1A=x"]),
    ],
)  # fmt: skip
def test_a_bad_value_is_the_command_lines_usage_error(
    kw: dict[str, object], flags: list[str]
) -> None:
    with pytest.raises(UsageError) as ours:
        run_options(kw, "run")
    with pytest.raises(UsageError) as theirs:
        cli.parse(["run", *flags, "--", "true"], environ=dict(os.environ), cwd="/w")
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize(
    "kw", [{"memory": True}, {"tty": "yes"}, {"net": "everywhere"}, {"pids": -1}, {"rw": [""]}]
)
def test_values_python_cannot_mean_are_usage_errors(kw: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        run_options(kw, "run")


def test_watch_events_are_decoded_by_their_kind() -> None:
    from boxy import events
    from boxy.outcome import State

    got = [
        events.decode(e)
        for e in (
            {"kind": "state", "t": 1.5, "state": "running"},
            {"kind": "started", "t": 1, "warnings": ["w"]},
            {"kind": "notice", "t": 1, "text": "denied x"},
            {"kind": "audit", "t": 1, "record": {"layer": "net", "verdict": "deny"}},
            {"kind": "counters", "t": 1, "counters": {"connections": 2},
             "destinations": [{"name": "a.test", "connections": 2, "denied": 1}]},
            {"kind": "lost", "t": 1, "count": 7},
            {"kind": "exited", "t": 1, "outcome": {"exit_status": 3, "reason": "exit"}},
            {"kind": "detached", "t": 1},
            {"kind": "from-the-future", "t": 1, "x": 1},
            {"kind": "state", "t": 1, "state": "no-such-state"},
        )
    ]  # fmt: skip
    assert [type(e).__name__ for e in got] == [
        "StateChanged", "Started", "Noticed", "Audited", "CountersTick", "Lost", "Exited",
        "Detached", "UnknownEvent", "UnknownEvent",
    ]  # fmt: skip
    assert got[0].state is State.RUNNING and got[0].t == 1.5  # type: ignore[attr-defined]
    assert got[3].denied  # type: ignore[attr-defined]
    assert got[4].destinations[0].denied == 1  # type: ignore[attr-defined]
    assert got[6].outcome.exit_status == 3  # type: ignore[attr-defined]


# --- every option of the table, the same through the command line and the library ---

# a sample of each type, as its flag's text; the library gets the same text
SAMPLE = {
    "profile": "node",
    "path": "/usr",  # a directory there is: the client checks -w's before a daemon does
    "copy": "/etc/hosts:/x",
    "host": "example.com:443",
    "port": "8443",
    "cidrs": "192.0.2.0/24",
    "publish": "127.0.0.1:8080:80",
    "env": "A=1",
    "secret": "BOXY_TEST_SECRET",
    "size": "64MiB",
    "count": "64",
    "cpus": "1.5",
    "duration": "90s",
}
# what an option needs beside it to be given at all (the table's refused combinations)
BESIDE: dict[str, dict[str, object]] = {
    "allow_host": {"net": "allowlist"},
    "allow_port": {"net": "allowlist"},
    "allow_cidr": {"net": "allowlist"},
    "pcap_max": {"pcap": "/srv/p.pcap"},
    "tty_raw": {"tty": True},
}


def _both(field: str, given: object, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    """FIELD given as GIVEN (its flag's text, or True for a switch), with what it needs
    beside it, to boxyctl's parser and to the library: the two RunOptions."""
    monkeypatch.setenv("BOXY_TEST_SECRET", "s3")
    fields = {field: given, **BESIDE.get(field, {})}
    argv = ["run"]
    for name, value in fields.items():
        option = BY_FIELD[name]
        argv += [option.flag] if value is True else [option.flag, str(value)]
    cmd = cli.parse([*argv, "--", "true"], environ=dict(os.environ), cwd="/w")
    lib = run_options({k: v if v is True else [v] if BY_FIELD[k].kind == "append" else v
                       for k, v in fields.items()}, "run")  # fmt: skip
    return cmd.args["request"].options, lib


@pytest.mark.parametrize("option", [o for o in RUN_OPTIONS if o.field not in ("detach",)],
                         ids=lambda o: o.field)  # fmt: skip
def test_every_option_means_the_same_through_the_library(
    option: Option, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library converts each option as the command line does (it once had a table
    of its own, without `publish`: KeyError)."""
    monkeypatch.chdir("/")  # the library's paths are against its cwd, the parser's /w
    if option.kind == "true":
        given: object = True
    elif option.type == "choice":
        given = (option.choices or ())[-1]
    else:
        given = SAMPLE[option.type]
    ours, theirs = _both(option.field, given, monkeypatch)
    assert ours == theirs, (option.field, ours, theirs)
    assert getattr(ours, option.field) not in (None, [], False), option.field  # it was set


def test_publish_through_the_library() -> None:
    o = run_options({"publish": ["8080:80", values.PortMapping("127.0.0.1", 9090, 90)]}, "run")
    assert o.publish == [
        values.PortMapping("127.0.0.1", 8080, 80),
        values.PortMapping("127.0.0.1", 9090, 90),
    ]
