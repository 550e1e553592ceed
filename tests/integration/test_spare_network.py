"""A spare's network made ahead of its plan (boxyd/stage2/__main__.py, prepare_network
and enter_namespaces) on the real kernel, as the unprivileged test user.

This file is also the script that user runs (``python -I test_spare_network.py ROOT
CASE``), in a fresh single-threaded interpreter, as the outer stage 2 would: it makes
(or not) the network ahead as a spare told to Prepare does, then steps 1–5 for a plan,
and prints one JSON report; the tests assert on it. Nothing here sends a packet
anywhere but over loopback inside the namespaces it made.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.conftest import User


def _net() -> str:
    return os.readlink("/proc/self/ns/net")


def _loopback_echo() -> bool:
    """A TCP connection to a listener on 127.0.0.1 works (lo is up)."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        with socket.create_connection(srv.getsockname(), timeout=5) as c:
            peer, _ = srv.accept()
            with peer:
                c.sendall(b"ping")
                return peer.recv(4) == b"ping"


def _plan(net: str, ruleset: str | None = None) -> Any:
    from boxyd.plan.ops import Outer

    return Outer(os.getuid(), os.getgid(), "boxy", net, ruleset, False, False)


def _after_steps(prepared: Any, plan: Any) -> dict[str, Any]:
    from boxyd.stage2 import __main__ as stage2

    ctl, boxyd = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ahead = _net()
    stage2.enter_namespaces(ctl, plan, prepared)
    boxyd.setblocking(False)
    try:
        said = boxyd.recv(4096).decode()
    except BlockingIOError:
        said = ""
    return {
        "ahead": ahead,
        "net": _net(),
        "links": sorted(name for _, name in socket.if_nameindex()),
        "loopback": _loopback_echo(),
        "said": said,
    }


def case_loopback_ahead() -> dict[str, Any]:
    """A --net none spare: step 1 and the run's network ahead, then its plan."""
    from boxyd.stage2 import __main__ as stage2

    before = _net()
    prepared = stage2.prepare_network(None, gateway=False)
    return {"before": before, **_after_steps(prepared, _plan("none"))}


def case_not_ahead() -> dict[str, Any]:
    """A child forked for the run (no spare was waiting): step 5 makes the network."""
    from boxyd.stage2 import namespaces

    before = _net()
    namespaces.enter_user_namespace(os.getuid(), os.getgid())
    return {"before": before, **_after_steps(None, _plan("none"))}


def case_loopback_ahead_networked_plan() -> dict[str, Any]:
    """A --net none spare given a networked plan (boxyd never does: Stage2.start keeps
    the kinds apart): it makes the gateway and the payload's network itself."""
    from boxyd.daemon.network import gateway_ruleset
    from boxyd.stage2 import __main__ as stage2

    before = _net()
    prepared = stage2.prepare_network(None, gateway=False)
    plan = _plan("public", gateway_ruleset("public", (), None, None))
    return {"before": before, **_after_steps(prepared, plan)}


CASES = {
    "loopback_ahead": case_loopback_ahead,
    "not_ahead": case_not_ahead,
    "loopback_ahead_networked_plan": case_loopback_ahead_networked_plan,
}


# ---------------------------------------------------------------------- the tests ---


def _report(user: User, case: str) -> dict[str, Any]:
    from tests.integration import scriptcases

    return scriptcases.report(user, __file__, case)


def test_a_net_none_spare_makes_the_runs_network_ahead_and_step_5_keeps_it(user: User) -> None:
    rep = _report(user, "loopback_ahead")
    assert rep["ahead"] != rep["before"], rep  # made before the plan came...
    assert rep["net"] == rep["ahead"], rep  # ...and the run's: step 5 made no other
    assert rep["links"] == ["lo"] and rep["loopback"], rep
    assert rep["said"] == "", rep  # no gateway: nothing for boxyd


def test_a_run_without_a_spare_gets_the_same_network_from_step_5(user: User) -> None:
    rep = _report(user, "not_ahead")
    assert rep["net"] != rep["before"], rep
    assert rep["links"] == ["lo"] and rep["loopback"], rep
    assert rep["said"] == "", rep


def test_a_net_none_spare_given_a_networked_plan_makes_the_gateway_itself(user: User) -> None:
    rep = _report(user, "loopback_ahead_networked_plan")
    assert rep["net"] not in (rep["before"], rep["ahead"]), rep  # the payload's, new
    assert rep["links"] == ["eth0", "lo"], rep
    assert json.loads(rep["said"])["kind"] == "listeners", rep  # the gateway's, to boxyd


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])  # (-I: the tree the test named)
    from tests.integration import scriptcases

    scriptcases.main(CASES)
