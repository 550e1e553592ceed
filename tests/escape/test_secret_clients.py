"""--secret NAME@HOST with the real clients the issue names, in the test internet: npm
(a project .npmrc's `_authToken=${TOKEN}`, sent as `Authorization: Bearer`;
`_password`, as Basic), pip (the index URL's userinfo, sent as Basic at once) and git
(the clone URL's userinfo, sent as Basic after the server's 401 challenge, on the same
connection; and `http.extraHeader`), each fetching a package from the test registry on
www.boxy.test (tests/harness/fakenet/registry.py), which serves only a request
carrying the real token. Each client succeeds, the server saw the value (never the
placeholder) in the credential it got, and the value is in nothing the payload or
boxy's records hold. Then what boxyctl says when the swap cuts a connection."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest

from tests.conftest import NetBoxy
from tests.escape.test_denial_clients import sections as _sections
from tests.escape.test_secret import _everything_under
from tests.harness.fakenet import plan, registry
from tests.harness.topology import Topology

pytestmark = pytest.mark.sandbox

TOKEN = plan.REGISTRY_TOKEN
WWW = plan.fqdn("www")
PKG = registry.NAME


def _run(
    netboxy: NetBoxy, net: Topology, steps: dict[str, str], *flags: str
) -> tuple[subprocess.CompletedProcess[bytes], dict[str, str]]:
    """STEPS run in one sandbox holding TOKEN's placeholder, bound to www; each
    step's output by label, and the placeholder under `ph`. The value is in none of
    the places the payload or boxy's records hold (the payload's output and
    environment, its work directory, the audit and net logs, boxy's state, the
    package caches a profile keeps for the project)."""
    body = "; ".join(f"echo '== {label}'; {cmd} 2>&1; echo EXIT $?" for label, cmd in steps.items())
    script = f"echo '== ph'; echo \"$TOKEN\"; echo '== env'; env; {body}"
    net.reset_records()
    r = netboxy.run(
        *flags, "--net", "allowlist", "--allow-host", WWW, "--secret", f"TOKEN@{WWW}",
        "--audit-log", "audit.jsonl", "--net-log", "net.json", "-v",
        cmd=["sh", "-c", script], extra_env={"TOKEN": TOKEN}, timeout=180,
    )  # fmt: skip
    got = _sections(r.stdout.decode(errors="replace"))
    assert set(got) == {"ph", "env", *steps}, (r.stdout, r.stderr)
    ph = got["ph"].strip()
    assert ph != TOKEN and len(ph) == len(TOKEN) and ph.startswith("npm_"), ph
    places = {
        "the payload's output and environment": r.stdout,
        "client output": r.stderr,
        "the work directory (the clients' files)": _everything_under(netboxy.workdir),
        "state (records, quarantine, boxyd's log)": _everything_under(
            Path(netboxy.env()["XDG_STATE_HOME"])
        ),
        "boxy's package caches (npm's)": _everything_under(netboxy.user.home / ".cache/boxy"),
    }
    assert (netboxy.workdir / "audit.jsonl").read_bytes(), "the audit log is written"
    leaked = [where for where, data in places.items() if TOKEN.encode() in data]
    assert not leaked, f"ESCAPED: the secret is in {leaked}"
    got["ph"] = ph
    return r, got


def _credentials(net: Topology, prefix: str) -> list[tuple[str, str | None]]:
    """(path, Authorization) of each request the registry got under PREFIX."""
    return [
        (e["path"], e.get("authorization"))
        for e in net.server_events("www")
        if e.get("kind") == "http" and e.get("path", "").startswith(prefix)
    ]


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _no_placeholder(seen: list[tuple[str, str | None]], ph: str) -> None:
    """No request carried the placeholder, plain or in Basic credentials."""
    for path, auth in seen:
        scheme, _, cred = (auth or "").partition(" ")
        decoded = base64.b64decode(cred) if scheme.lower() == "basic" else b""
        assert ph not in (auth or "") and ph.encode() not in decoded, (path, auth)


def test_npm_sends_a_bound_token_from_npmrc(netboxy: NetBoxy, net: Topology) -> None:
    """npm expands the project .npmrc's `_authToken=${TOKEN}` (the placeholder) and
    sends `Authorization: Bearer PH` to the registry and to the tarball's host; with
    `username` and `_password` (base64 of the token) it sends Basic: each gets the
    value. The .npmrc is not revealed: a token line that only names the environment
    holds no secret, and the cover keeps it (README "Credentials in the work
    directory are covered")."""
    npmrc = netboxy.workdir / ".npmrc"
    npmrc.write_text(f"//{WWW}/:_authToken=${{TOKEN}}\n")
    netboxy.user.chown(npmrc)
    flags = f"--registry https://{WWW}/npm/ --fetch-retries=0"
    basic = (  # not the .npmrc (another prefix): the token as Basic's password
        f'env "npm_config_//{WWW}/:username=npm" '
        f'"npm_config_//{WWW}/:_password=$(printf %s "$TOKEN" | base64 -w0)" '
        f"npm view {PKG} version --userconfig /dev/null --prefix basic {flags}"
    )
    steps = {
        "view": f"npm view {PKG} version {flags}",
        "install": f"npm install {PKG} --no-audit --no-fund {flags}",
        "installed": f"cat node_modules/{PKG}/package.json",
        "basic": f"mkdir basic; {basic}",
    }
    r, got = _run(netboxy, net, steps, "-p", "node")
    assert r.returncode == 0, r.stderr
    assert got["view"].splitlines()[0] == registry.VERSION, got["view"]
    assert "EXIT 0" in got["install"] and f'"name": "{PKG}"' in got["installed"], got
    assert got["basic"].splitlines()[0] == registry.VERSION, got["basic"]
    seen = _credentials(net, "/npm/")
    tarball = f"/npm/{PKG}/-/{PKG}-{registry.VERSION}.tgz"
    assert (f"/npm/{PKG}", f"Bearer {TOKEN}") in seen, seen
    assert (tarball, f"Bearer {TOKEN}") in seen, seen
    assert (f"/npm/{PKG}", _basic("npm", TOKEN)) in seen, seen
    _no_placeholder(seen, got["ph"])


def test_pip_sends_a_bound_token_from_the_index_urls_userinfo(
    netboxy: NetBoxy, net: Topology
) -> None:
    """pip takes `user:PH@` off the index URL and sends it as Basic to the index and
    the file links on its host: both get Basic user:VALUE."""
    pip = "python3 -m pip download --no-deps --no-cache-dir --retries 0 -d dl"
    steps = {
        "download": f'{pip} --index-url "https://user:$TOKEN@{WWW}/simple/" {PKG}',
        "saved": "ls dl",
    }
    r, got = _run(netboxy, net, steps)
    assert r.returncode == 0, r.stderr
    assert "EXIT 0" in got["download"] and registry.WHEEL in got["saved"], got
    seen = _credentials(net, "/")
    basic = _basic("user", TOKEN)
    assert (f"/simple/{PKG}/", basic) in seen, seen
    assert (f"/packages/{registry.WHEEL}", basic) in seen, seen
    _no_placeholder(seen, got["ph"])


def test_git_sends_a_bound_token_as_basic_and_as_an_extra_header(
    netboxy: NetBoxy, net: Topology
) -> None:
    """git clone with `x-access-token:PH@` in the URL asks first with no credentials,
    gets the 401 challenge and asks again with Basic (curl's retry, on the same
    connection); with `http.extraHeader` it sends `Authorization: Bearer PH` at once."""
    steps = {
        "userinfo": f'git clone -q "https://x-access-token:$TOKEN@{WWW}/repo.git" basic',
        "header": f'git -c http.extraHeader="Authorization: Bearer $TOKEN" clone -q '
        f"https://{WWW}/repo.git bearer",
        "checked out": "cat basic/README bearer/README",
    }
    r, got = _run(netboxy, net, steps)
    assert r.returncode == 0, r.stderr
    assert "EXIT 0" in got["userinfo"] and "EXIT 0" in got["header"], got
    assert got["checked out"].count(registry.README.decode()) == 2, got
    seen = _credentials(net, "/repo.git/")
    basic, bearer = _basic("x-access-token", TOKEN), f"Bearer {TOKEN}"
    refs = "/repo.git/info/refs?service=git-upload-pack"
    assert (refs, None) in seen, seen  # the challenge's first ask
    assert (refs, basic) in seen and (refs, bearer) in seen, seen
    asked = {  # the ask and the answer to the challenge: on one kept-alive connection
        e.get("authorization"): e["peer"]
        for e in net.server_events("www")
        if e.get("kind") == "http" and e.get("path") == refs
    }
    assert asked[None] == asked[basic], asked
    objects = [(p, a) for p, a in seen if p.startswith("/repo.git/objects/")]
    assert {a for _, a in objects} == {basic, bearer} and len(objects) == 6, seen
    _no_placeholder(seen, got["ph"])


H2 = r"""
import os, socket, ssl
ctx = ssl.create_default_context()  # SSL_CERT_FILE: the session CA
with ctx.wrap_socket(socket.create_connection(("{www}", 443), timeout=10),
                     server_hostname="{www}") as t:
    t.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    try:
        print("READ", t.recv(100))
    except OSError as e:
        print("CUT", type(e).__name__)
"""


def test_boxyctl_says_why_the_swap_cut_a_connection(netboxy: NetBoxy, net: Topology) -> None:
    """A connection the swap cut for what it could not read is said at the end with
    the swap's reason (a Host naming another name, HTTP/2), not as a placeholder sent."""
    steps = {
        "host": f'curl -sS -o /dev/null -H "Host: v4only.boxy.test" '
        f'-H "Authorization: Bearer $TOKEN" https://{WWW}/record-host',
        "h2": f"python3 -c '{H2.format(www=WWW)}'",
    }
    r, got = _run(netboxy, net, steps)
    err = r.stderr.decode()
    assert "EXIT 0" not in got["host"], got
    assert "READ b''" in got["h2"] or "CUT" in got["h2"], got
    cut = f"a connection to {WWW} was cut by the secret swap: "
    assert cut + "a request not for its connection's host (one Host, naming it)" in err, err
    assert cut + "HTTP/2 (the swap reads HTTP/1.1 alone)" in err, err
    assert f"a secret's placeholder was sent to {WWW}" not in err, err
    assert not _credentials(net, "/record-host")  # never sent on
