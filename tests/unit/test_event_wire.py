"""One encoding of the typed event, carried by both wires (issue 32 §4: varlink
called the busiest destinations "destinations", D-Bus "top", and D-Bus flattened
records and outcomes into its fields). Every session event's Event.to_wire is
what the IDL's Event type declares, varlink's Watch frame carries it as it is, and
D-Bus's Event signal carries the same fields as variants (nested values as JSON)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest
from dbus_fast import Variant

from boxy.outcome import Counters, Destination, Outcome, Reason, State
from boxyd.api import idl
from boxyd.api.dbus import event_fields
from boxyd.api.service import watch_frame
from boxyd.daemon.events import (
    Audited,
    ClientAttached,
    ClientDetached,
    CountersTick,
    Exited,
    Lost,
    Noticed,
    PayloadStopped,
    RunStarted,
    SessionEvent,
    StateChanged,
)

SAMPLES: list[SessionEvent] = [
    StateChanged(State.RUNNING),
    RunStarted(["--memory: no memory controller"]),
    Noticed("denied evil.example"),
    PayloadStopped(19),
    Audited({"layer": "dns", "verdict": "deny", "name": "evil.example", "n": 2}),
    CountersTick(Counters(3, 1, 400, 5000, 2), [Destination("registry.example", 3, 1, 0, 4, 5)]),
    ClientDetached(),
    ClientAttached(),
    Exited(Outcome(3, Reason.EXIT, findings=["a finding"])),
    Lost(7),
]


def test_every_session_event_has_a_sample() -> None:
    kinds = {type(e) for e in SAMPLES}
    assert kinds == set(SessionEvent.__args__)  # the union's members


def _idl() -> idl.Interface:
    return idl.parse((resources.files("boxy") / "dev.boxy.Manager.varlink").read_text())


@pytest.mark.parametrize("ev", SAMPLES, ids=lambda e: e.kind)
def test_the_encoding_is_the_idls_event(ev: SessionEvent) -> None:
    iface = _idl()
    wire = ev.to_wire()
    assert wire["kind"] == ev.kind and wire["t"] == round(ev.t, 3)
    assert idl.check(iface, iface.types["Event"], wire, "event") is None, wire


@pytest.mark.parametrize("ev", SAMPLES, ids=lambda e: e.kind)
def test_varlink_carries_the_encoding_as_it_is(ev: SessionEvent) -> None:
    frame = watch_frame(ev)
    assert frame.endswith(b"\0")
    assert json.loads(frame[:-1]) == {"parameters": {"event": ev.to_wire()}, "continues": True}


def _plain(v: Variant) -> Any:
    """A field as a D-Bus client reads it: nested values are JSON text."""
    if v.signature == "s" and v.value[:1] in ("{", "["):
        return json.loads(v.value)
    return v.value


@pytest.mark.parametrize("ev", SAMPLES, ids=lambda e: e.kind)
def test_dbus_carries_the_same_fields(ev: SessionEvent) -> None:
    wire = {k: v for k, v in ev.to_wire().items() if k != "kind"}
    fields = event_fields(ev)
    assert {k: _plain(v) for k, v in fields.items()} == wire
