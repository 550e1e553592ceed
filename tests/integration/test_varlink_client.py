"""The varlink wire as its users' tools use it: the varlink project's own reference
client (the `varlink` package) against a real boxyd, as the test user. It reads
the service's info, fetches dev.boxy.Manager's description and parses it with its
own parser, starts a detached run without passing any fds (issue 32 §5: a client
without fd passing could not start one), reads its output, shows it, and gets a
named error. The D-Bus wire's clients (busctl, dbus-python) are tried in
test_systemd.py, under a real user manager."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN, Boxy, User

pytestmark = pytest.mark.sandbox

CLIENT = r"""
import base64, json, sys, time
import varlink

address, cwd = "unix:" + sys.argv[1], sys.argv[2]
out = {}
with varlink.Client(address=address) as client:
    client.get_interfaces()  # org.varlink.service.GetInfo
    out["info"] = client.info
    with client.open("dev.boxy.Manager") as m:  # GetInterfaceDescription, parsed
        build = m.Version()["build"]
        run = m.Run(
            argv=["sh", "-c", "echo from the payload; exit 3"],
            cwd=cwd,
            options={"detach": True, "net": "none"},
            client_env={},
            build=build,
        )
        out["run"] = run
        data, offset = b"", 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            piece = m.Output(id=run["id"], offset=offset)
            data, offset = data + base64.b64decode(piece["data"]), piece["offset"]
            if piece["ended"] and not piece["data"]:
                break
            time.sleep(0.05)
        out["output"] = data.decode()
        out["show"] = m.Show(id=run["id"])["session"]
        out["listed"] = [s["id"] for s in m.List(all=True)["sessions"]]
        try:
            m.Show(id="0000dead")
        except varlink.VarlinkError as e:
            out["error"] = e.error()
print(json.dumps(out))
"""


def test_the_reference_varlink_client_runs_a_detached_session_without_fds(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    up = user.run([str(BIN / "boxyctl"), "ps"])  # boxyd is up (started on demand)
    assert up.returncode == 0, up.stderr
    socket = user.runtime / "boxy" / "boxyd.sock"
    r = user.run([str(BIN / "python3"), "-c", CLIENT, str(socket), str(workdir)], timeout=90)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    out: dict[str, Any] = json.loads(r.stdout)
    info = out["info"]
    assert (info["vendor"], info["product"]) == ("boxy", "boxyd")
    assert info["url"] == "man:boxyctl(1)"  # issue 32 §5: it was empty
    assert "dev.boxy.Manager" in info["interfaces"]
    assert out["run"]["kind"] == "running" and len(out["run"]["id"]) == 8, out["run"]
    # a detached run is on a terminal of boxyd's (Attach joins it): CR LF
    assert out["output"] == "from the payload\r\n"
    assert out["show"]["state"] == "exited", out["show"]
    assert out["show"]["outcome"]["exit_status"] == 3
    assert out["run"]["id"] in out["listed"]
    assert out["error"] == "dev.boxy.Manager.NoSuchSession", out
