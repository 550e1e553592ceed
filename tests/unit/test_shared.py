"""The shared package `boxy`: its one error table, the typed request's decoding,
the IDL that agrees with both, and the import rules that keep it shared."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from boxy import INTERFACE, VERSION, errors
from boxy.errors import (
    BoxyError,
    BuildMismatch,
    Busy,
    InternalError,
    NoSuchSession,
    ProfileError,
    SetupError,
    UsageError,
)
from boxy.outcome import Destination, Outcome, Reason, State
from boxy.request import CopyItem, EnvItem, RunOptions, RunRequest, Secret, Terminal

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("exc", [
    UsageError("bad flag"), ProfileError("bad key"), SetupError("no landlock"),
    NoSuchSession("abcd1234"), Busy("sessions are running"), BuildMismatch("d1", "c2"),
    InternalError("a bug"), BoxyError("anything"),
])  # fmt: skip
def test_every_error_survives_both_wires(exc: BoxyError) -> None:
    name, params = errors.varlink_error(exc)
    assert name.startswith(INTERFACE + ".")
    back = errors.from_wire(name, params)
    assert type(back) is type(exc) and str(back) == str(exc) and back.exit_status == exc.exit_status
    dbus = errors.dbus_error_name(exc)
    assert dbus.startswith("dev.boxy.Error.")
    assert type(errors.from_wire(dbus, params)) is type(exc)


def test_most_specific_row_wins_and_unknown_names_are_not_ours() -> None:
    assert errors.short_name(ProfileError("x")) == "InvalidProfile"
    assert errors.short_name(UsageError("x")) == "InvalidArgument"
    assert errors.from_wire("org.varlink.service.MethodNotFound", {}) is None
    assert errors.from_wire(INTERFACE + ".SomethingNew", {}) is None


def test_the_idl_names_the_interface_and_every_error_of_the_table() -> None:
    idl = (ROOT / "boxy" / f"{INTERFACE}.varlink").read_text()
    assert re.search(rf"^interface {re.escape(INTERFACE)}$", idl, re.M)
    declared = re.findall(r"^error (\w+) ", idl, re.M)
    assert sorted(declared) == sorted(name for _, name in errors.ERRORS)


def test_version_is_written_once() -> None:
    hits = [
        p
        for p in ROOT.glob("*/**/*.py")
        if ".venv" not in p.parts and "tests" not in p.parts and VERSION in p.read_text()
    ]
    assert hits == [ROOT / "boxy" / "ident.py"]
    assert 'dynamic = ["version"]' in (ROOT / "pyproject.toml").read_text()


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_boxy_imports_neither_side_and_boxyd_never_imports_the_client() -> None:
    for path in (ROOT / "boxy").glob("*.py"):
        bad = {m for m in _imports(path) if m.split(".")[0] in ("boxyd", "boxyctl")}
        assert not bad, f"{path.name} imports {bad}"
    for path in (ROOT / "boxyd").rglob("*.py"):
        bad = {m for m in _imports(path) if m.split(".")[0] == "boxyctl"}
        assert not bad, f"{path} imports {bad}"


def test_the_client_reaches_boxyd_only_through_the_api() -> None:
    """Issue 32 §3: boxyctl imports boxy and itself, never a module of the daemon's
    (profile show, doctor and trust are boxyd's methods; what both sides need is in
    boxy/). Type-only imports count too: they name the daemon's types."""
    for path in (ROOT / "boxyctl").rglob("*.py"):
        bad = {m for m in _imports(path) if m.split(".")[0] == "boxyd"}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_the_run_path_of_the_client_loads_no_daemon_module() -> None:
    """`boxyctl run` parses and builds its request with boxy alone (and no asyncio,
    yaml or dns: start-up time is part of every run)."""
    code = (
        "import sys; from boxyctl import cli; "
        "c = cli.parse(['run', '-p', 'node', '-e', 'A=1', '--', 'true'], environ={'HOME': '/h'}, "
        "cwd='/w'); c.args['request'].to_wire(); from boxy import outcome, varlink; "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('boxyd', 'asyncio', 'yaml', 'dns', 'dataclasses', 'typing'))))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == []


def test_request_decoding_refuses_every_wrong_shape_with_one_line() -> None:
    base = {"argv": ["true"], "cwd": "/w", "options": {}, "client_env": {}}
    cases = [
        ({**base, "argv": []}, "missing command"),
        ({**base, "argv": [1]}, "missing command"),
        ({**base, "cwd": "rel"}, "cwd: expected an absolute path"),
        ({**base, "client_env": {"A": 1}}, "client_env: expected an object of strings"),
        ({**base, "options": []}, "options: expected an object"),
        ({**base, "options": {"nope": 1}}, "unknown option 'nope'"),
        ({**base, "options": {"memory": True}}, "options.memory: expected a size in bytes"),
        ({**base, "options": {"memory": -1}}, "options.memory: expected a size in bytes"),
        ({**base, "options": {"pids": 1.5}}, "options.pids: expected a positive whole number"),
        ({**base, "options": {"timeout": 0}}, "options.timeout: expected a positive number"),
        (
            {**base, "options": {"timeout": float("inf")}},
            "options.timeout: expected a positive number",
        ),
        ({**base, "options": {"ro": "/x"}}, "options.ro: expected a list of strings"),
        (
            {**base, "options": {"allow_port": [True]}},
            "options.allow_port: expected a list of port",
        ),
        ({**base, "options": {"env": [{"value": "x"}]}}, "options.env: expected a list of {name"),
        (
            {**base, "options": {"secret": [{"name": "A"}]}},
            "options.secret: expected a list of {name",
        ),
        ({**base, "options": {"copy": [{"src": 1}]}}, "options.copy: expected a list of {src"),
        ({**base, "options": {"tty": "yes"}}, "options.tty: expected true or false"),
        ({**base, "options": {"profile": 3}}, "options.profile: expected a string"),
        ("nope", "parameters must be an object"),
    ]
    for params, message in cases:
        with pytest.raises(UsageError) as e:
            RunRequest.from_wire(params)
        assert message in str(e.value) and "\n" not in str(e.value), (params, str(e.value))


def test_request_round_trip_and_defaults() -> None:
    req = RunRequest(
        ["npm", "ci"],
        "/w",
        RunOptions(
            ro=["/a"],
            copy=[CopyItem("/s", None)],
            env=[EnvItem("A", "1"), EnvItem("B", None)],
            secret=[Secret("T", "s3cret")],
            memory=1 << 30,
            cpus=1.5,
            tty=True,
        ),
        {"HOME": "/h"},
        Terminal([0, 0, 0, 0, 38400, 38400, [0] * 32], [24, 80, 0, 0]),
        "b1",
    )
    assert RunRequest.from_wire(req.to_wire()) == req
    assert "s3cret" not in repr(req)
    assert RunRequest.from_wire({"argv": ["x"], "cwd": "/"}).options == RunOptions()
    with pytest.raises(TypeError):
        RunOptions(nope=1)
    assert Terminal.from_wire({"termios": [1, 2], "winsize": [1, 2, 3, 4]}) is None


@pytest.mark.parametrize("reason, state", [
    (Reason.EXIT, State.EXITED), (Reason.SIGNAL, State.KILLED), (Reason.SECCOMP, State.KILLED),
    (Reason.TIMEOUT, State.TIMED_OUT), (Reason.SETUP, State.FAILED), (Reason.EXEC, State.FAILED),
])  # fmt: skip
def test_outcome_states_and_wire(reason: Reason, state: State) -> None:
    row = Destination("a.example", 2, 1, 1, 10, 20)
    out = Outcome(3, reason, "msg", signal=None, findings=["f"], notes=["n"], destinations=[row])
    assert out.state is state and state.finished
    assert Outcome.from_wire(out.to_wire()) == out
    assert out.to_wire()["state"] == state.value
    assert not State.RUNNING.finished and not State.STARTING.finished


def test_a_listing_carries_a_summary() -> None:
    from boxy.outcome import Counters, SessionInfo

    out = Outcome(1, Reason.EXIT, "m", findings=["f"] * 100, destinations=[Destination("t")] * 99)
    info = SessionInfo(
        "0123abcd",
        State.EXITED,
        ["x" * 2_000_000, "y"],
        "/w",
        None,
        1.0,
        2.0,
        out,
        Counters(connections=3),
        limits=["l"],
    )
    brief = info.summary()
    assert len(json.dumps(brief.to_wire())) < 4096
    assert brief.outcome is not None
    assert brief.argv == ["x" * 1024] and brief.outcome.exit_status == 1
    assert brief.outcome.findings == [] and brief.limits == [] and brief.counters.connections == 3
