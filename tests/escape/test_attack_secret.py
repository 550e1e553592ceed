"""Attacks on `--secret NAME@HOST` from a hostile payload: make boxyd put the value
where the payload can read it back, or into a request for anyone but the secret's
host. Each request is written by hand over the session CA's TLS to www.boxy.test
(whose server answers with the Host header and the request target it saw, and
records the Authorization of a /record… request). A line `ESCAPED …` and a failed
test mean the value got out."""

from __future__ import annotations

import json

import pytest

from tests.conftest import NetBoxy
from tests.escape.test_secret import SECRET
from tests.harness.topology import Topology

pytestmark = pytest.mark.sandbox

HOST = "www.boxy.test"
# Each attack: a label and a request (PH stands for the placeholder). The payload
# prints what came back; the value in it is an escape.
ATTACKS = r"""
import json, os, socket, ssl
ph = os.environ["BOXY_TEST_TOKEN"]
H = "www.boxy.test"
ATTACKS = {
    # a header the server reflects (every server that builds a redirect from Host)
    "host-reflected": f"GET / HTTP/1.1\r\nHost: {ph}\r\nConnection: close\r\n\r\n",
    # userinfo in the request target: never a credential a client sends (RFC 9110
    # 4.2.4), and the target comes back in redirects and error pages
    "userinfo-reflected": f"GET https://u:{ph}@{H}/ HTTP/1.1\r\nHost: {H}\r\n"
                          "Connection: close\r\n\r\n",
    # TLS to the secret's host, the request for another one behind it (virtual hosts
    # under one certificate, a CDN's fronting): the value goes to that one
    "other-vhost": f"GET /record-vhost HTTP/1.1\r\nHost: v4only.boxy.test\r\n"
                   f"Authorization: Bearer {ph}\r\nConnection: close\r\n\r\n",
    # a bare LF: one credential header to the swap, two headers to the server
    "bare-lf": f"GET / HTTP/1.1\r\nAuthorization: Bearer {ph}\nHost: {ph}\r\nHost: {H}\r\n"
               "Connection: close\r\n\r\n",
    # the control: a bearer token as a tool sends it
    "control": f"GET /record-control HTTP/1.1\r\nHost: {H}\r\nAuthorization: Bearer {ph}\r\n"
               "Connection: close\r\n\r\n",
}
ctx = ssl.create_default_context()  # SSL_CERT_FILE: the bundle with the session's CA
for label, req in ATTACKS.items():
    got = b""
    try:
        with socket.create_connection((H, 443), timeout=10) as s:
            with ctx.wrap_socket(s, server_hostname=H) as t:
                t.sendall(req.encode())
                while chunk := t.recv(65536):
                    got += chunk
    except Exception as e:
        got += f" [{type(e).__name__}]".encode()
    print("ATTACK", json.dumps({"label": label, "got": got.decode("latin-1")}), flush=True)
"""


def _results(stdout: bytes) -> dict[str, str]:
    out = {}
    for line in stdout.decode(errors="replace").splitlines():
        if line.startswith("ATTACK "):
            r = json.loads(line[len("ATTACK ") :])
            out[r["label"]] = r["got"]
    return out


def test_the_value_never_comes_back_nor_goes_to_another_host(
    netboxy: NetBoxy, net: Topology
) -> None:
    net.reset_records()
    r = netboxy.run(
        "--net", "allowlist", "--allow-host", HOST, "--allow-host", "v4only.boxy.test",
        "--secret", f"BOXY_TEST_TOKEN@{HOST}",
        cmd=["python3", "-c", ATTACKS],
        extra_env={"BOXY_TEST_TOKEN": SECRET},
    )  # fmt: skip
    got = _results(r.stdout)
    assert len(got) == 5, (r.stdout, r.stderr)
    seen = [e for e in net.server_events("www") if e.get("kind") == "http"]
    auth = {e["path"]: (e.get("host"), e.get("authorization")) for e in seen}
    # the control: the swap works, so the attacks below are not vacuous
    assert "200 OK" in got["control"] and auth.get("/record-control") == (
        HOST,
        f"Bearer {SECRET}",
    ), (got, auth)
    escaped = [label for label, text in got.items() if label != "control" and SECRET in text]
    escaped += [
        f"{path} (Host {host})"
        for path, (host, a) in auth.items()
        if a and SECRET in a and (host or "").lower().split(":")[0] != HOST
    ]
    for what in escaped:
        print(f"ESCAPED: the secret's value reached {what}")
    assert not escaped, f"ESCAPED: {escaped}"
    # each attack cut and said at the run's end, with why (-v: "not swapped: …")
    cut = f"a connection to {HOST} was cut by the secret swap: "
    for why in (
        "a placeholder outside a credential header",  # host-reflected
        "an absolute target with userinfo",  # userinfo-reflected
        "a request not for its connection's host",  # other-vhost
        "a control byte, bare CR or LF",  # bare-lf
    ):
        assert cut + why in r.stderr.decode(), (why, r.stderr)
