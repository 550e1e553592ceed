"""A session's network, from the daemon's side: the policy compiled for stage 2
(nftables ruleset, Landlock ports), the gateway once stage 2 has sent its listeners,
and what is left afterwards (--net-log, the destinations table, audit records).

The DNS proxy is one per daemon (shared upstream slots); everything else is per
session.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import dns.message as dns_message

from boxy.errors import SetupError, UsageError
from boxy.values import plural, run_clock
from boxyd.config.runspec import RunSpec
from boxyd.daemon.asking import Answer, Answerer, Asking
from boxyd.daemon.seam import Caller, Change
from boxyd.daemon.who import Whos, namespace
from boxyd.net import netlog, pcap, ranges, ruleset, tailscale
from boxyd.net.dnsproxy import DnsProxy, DnsSession
from boxyd.net.gateway import LISTENERS, Gateway
from boxyd.net.hostnet import UPSTREAM_ENV, upstream_servers
from boxyd.net.hostsecrets import HostSecrets
from boxyd.net.policy import NetPolicy
from boxyd.net.refusals import Tally
from boxyd.net.sockdiag import Flow, SockDiag
from boxyd.plan.hostfile import Outputs, replaced
from boxyd.plan.ops import NetPlan

if TYPE_CHECKING:
    from boxyd.net.sessionca import SessionCA

log = logging.getLogger("boxyd")

MAX_NOTICES = 200  # -v denial lines per run; the rest are counted
PREFLIGHT_BUDGET = 3.0  # seconds for the allowlist's names before the payload starts
PREFLIGHT_NAMES = 8  # a long allowlist is not resolved whole before every run
# The preflight's lines by what they depend on, kept this many seconds: they are a
# warning (the run's own DNS session decides every answer it gets), and asking upstream
# again before every run cost each allowlisted start a round trip.
PREFLIGHT_KEEP = 30.0
_PREFLIGHT: dict[tuple[object, ...], tuple[float, list[str]]] = {}


MAX_HOSTS_PER_CHANGE = 64  # one change names at most this many hosts
# --ask's `once`: the lookup answered, and connections to its answer made within this
# many seconds; then the name is asked about again (what is open stays open)
ONCE_WINDOW = 10.0


def _secrets(spec: RunSpec) -> tuple[HostSecrets, SessionCA] | None:
    """--secret NAME@HOST: the values and the session's CA (its key in memory only)."""
    if not spec.host_secrets or spec.net == "none":
        return None
    from boxyd.net.sessionca import SessionCA  # (cryptography: only when needed)

    found = HostSecrets(spec.host_secrets)
    return found, SessionCA(found.hosts)


def host_bundle() -> bytes:
    """The host's certificate bundle (what the sandbox trusts without --secret)."""
    import ssl

    paths = ssl.get_default_verify_paths()
    for path in ("/etc/ssl/certs/ca-certificates.crt", paths.cafile, paths.openssl_cafile):
        if path:
            with contextlib.suppress(OSError), open(path, "rb") as f:
                return f.read()
    return b""


class Network:
    """One session's network. Build it before stage 2 starts (bad flags are refused
    there), then ``attach`` the listeners stage 2 sends."""

    def __init__(
        self,
        spec: RunSpec,
        *,
        record: Callable[..., None],
        notice: Callable[[str], None] | None,
        tailnet: str | None = None,
        outputs: Outputs | None = None,
    ) -> None:
        """TAILNET: the MagicDNS suffix of a running tailscaled (--tailscale). OUTPUTS:
        the session's --net-log and --pcap files, open already (borrowed, not owned)."""
        self.warnings: list[str] = []
        hosts = spec.allow_hosts
        if tailnet:
            hosts = tailscale.qualify_hosts(hosts, tailnet)
        elif spec.tailscale:
            self.warnings.append(
                "--tailscale: tailscaled is not running (or `tailscale status` "
                "failed): the tailnet's ranges are allowed, but MagicDNS names "
                "will not resolve"
            )
        self.tailnet = tailnet
        # Raises UsageError (one line, exit 2) for what the spec could not catch alone.
        self.policy = NetPolicy.from_spec(
            spec.net, hosts, spec.allow_ports, spec.allow_cidrs, spec.tailscale
        )
        self.spec = spec
        self.record = record
        self.notice = notice
        self.gateway: Gateway | None = None
        self._capture: pcap.Writer | None = None
        self._capture_sock: socket.socket | None = None
        self._netlog_fd = outputs.net_log if outputs is not None else None
        if (
            outputs is not None and outputs.pcap is not None
        ):  # a capture that cannot be fails the run
            try:
                pcap.write_header(outputs.pcap)
            except OSError as e:
                raise UsageError(f"--pcap {spec.pcap}: {e.strerror}") from None
            self._capture = pcap.Writer(outputs.pcap, spec.pcap_max)
        self._notices = 0
        self._muted = 0
        self.refused = Tally()
        self.asking: Asking | None = None  # --ask (ask_on)
        self._remember: Callable[[str], Awaitable[str]] | None = None  # `for this project`
        self._once: dict[str, asyncio.TimerHandle] = {}  # `once`: when each is forgotten
        self._answerers: Callable[[], Sequence[Answerer]] = lambda: ()
        self.whos: Whos | None = None  # --ask: who asked (attach, pid1)
        self._t0 = time.time()
        self.secrets = _secrets(spec)
        record(
            "net.policy",
            mode=spec.net,
            allow_hosts=spec.allow_hosts,
            allow_ports=sorted(self.policy.global_ports),
            allow_cidrs=spec.allow_cidrs,
            tailscale=spec.tailscale,
        )

    async def check_hosts(self, dns: DnsProxy, *, budget: float = PREFLIGHT_BUDGET) -> None:
        """The allowlist's names resolved before the payload starts, through the DNS
        policy the gateway applies (the shared proxy, a throwaway session: nothing is
        bound): a name whose every answer lies in a refused range is said now, in one
        line, not after the payload waited for it (npm waited 70 s). Bounded by
        BUDGET; a name that does not answer in time is left to the run."""
        names = _plain_names(self.policy)
        if not names:
            return
        kinds = ("A", "AAAA") if dns.ipv6 else ("A",)
        key = (tuple(names), kinds, self.policy.mode, self.policy.exceptions)
        kept = _PREFLIGHT.get(key)
        if kept is not None and time.monotonic() - kept[0] < PREFLIGHT_KEEP:
            self.warnings += kept[1]
            return
        events: list[dict[str, Any]] = []
        session = DnsSession(policy=self.policy, on_event=lambda ev: events.append(dict(ev)))
        asks = [
            dns.answer(dns_message.make_query(n, k).to_wire(), tcp=False, session=session)
            for n in names
            for k in kinds
        ]
        # what answered in time is judged; the rest is the run's to find out
        try:
            await asyncio.wait_for(asyncio.gather(*asks, return_exceptions=True), budget)
        except TimeoutError:
            self.warnings += refused_names(events)
            return
        lines = refused_names(events)
        if len(_PREFLIGHT) >= 64:
            _PREFLIGHT.clear()
        _PREFLIGHT[key] = (time.monotonic(), lines)  # only a whole answer is kept
        self.warnings += lines

    def plan(self) -> NetPlan:
        """The network's part of the plan (mountplan.build): the gateway netns's
        ruleset, Landlock's connect ports, the capture, the tailnet's domain."""
        ports = self.policy.landlock_ports()
        udp = self.policy.udp_ports()
        literals = (
            tuple(self.policy.literal_addresses()) if self.policy.mode == "allowlist" else None
        )
        ruleset = gateway_ruleset(
            self.policy.mode,
            self.policy.exceptions,
            None if ports is None else tuple(ports),
            None if udp is None else tuple(udp),
            literals,
        )
        bundle = None
        if self.secrets is not None:
            from boxyd.net.sessionca import bundle as ca_bundle

            bundle = ca_bundle(self.secrets[1].pem(), host_bundle()).decode()
        return NetPlan(ruleset, ports, self._capture is not None, self.tailnet or None, bundle)

    def ask_on(
        self,
        answerers: Callable[[], Sequence[Answerer]],
        remember: Callable[[str], Awaitable[str]] | None,
    ) -> None:
        """--ask: a name the allowlist does not hold is asked about where ANSWERERS say
        (daemon/asking.py); the answer is a change of this policy like `boxyctl allow`
        or `deny`'s, recorded with who gave it. REMEMBER writes a name into the
        project's configuration (`for this project`): the line to say, or UsageError."""
        self._remember, self._answerers = remember, answerers
        choices = tuple(a for a in Answer if a is not Answer.PROJECT or remember is not None)
        self.asking = Asking(self.spec.ask_timeout, answerers, self._answered, choices)

    async def _ask(self, host: str, port: int | None, flow: Flow | None) -> bool:
        """--ask, for the gateway and its DNS proxy: HOST (on PORT; None: a lookup) sent
        on FLOW, asked about naming the program that sent it, when someone can answer
        (nobody: refused at once, and nobody to name it to)."""
        assert self.asking is not None
        who = None
        here = any(a.can_answer() for a in self._answerers())
        if self.whos is not None and flow is not None and here:
            who = await self.whos.who(flow)
        return await self.asking.ask(host, port, who=who)

    def started(self, userns: int) -> None:
        """PID 1 is forked; USERNS (an nsfs fd) is the sandbox's user namespace, which
        holds every process of the payload's: who asked is looked for among them."""
        if self.whos is not None:
            self.whos.userns = namespace(userns)

    async def _answered(self, host: str, answer: Answer, via: str) -> str | None:
        change = Change.DENY if answer is Answer.DENY else Change.ALLOW
        caller = Caller(os.getuid(), None, via)
        try:
            self.change(change, [host], caller, time.time() - self._t0, answer=answer.value)
        except UsageError as e:  # a name the policy cannot take stays refused
            return str(e)
        if answer is Answer.ONCE:
            self._once[host] = asyncio.get_running_loop().call_later(
                ONCE_WINDOW, self._forget, host
            )
        # what the answer did, said under the question: the exact name it applies to
        said = {
            Answer.ONCE: f"{host}: allowed once (its lookups and connections for {ONCE_WINDOW:g}s)",
            Answer.SESSION: f"{host}: allowed for this session",
            Answer.DENY: f"{host}: refused for this session",
        }
        if answer is not Answer.PROJECT or self._remember is None:
            return said.get(answer, f"{host}: allowed for this session")
        try:
            return await self._remember(host)
        except UsageError as e:  # allowed for the session all the same
            return f"{host}: allowed for this session only; {e}"

    def _forget(self, host: str) -> None:
        """`once` is over for HOST: asked about again from now on; what it opened
        stays open (it was allowed when it began)."""
        self._once.pop(host, None)
        if self.gateway is None:
            return
        self.policy = self.policy.forgetting([host])
        self.gateway.set_policy(self.policy, cut=False)
        self.record("net.policy", verdict="forget", hosts=[host], answer="once")

    def attach(self, listeners: dict[str, socket.socket], dns: DnsProxy) -> None:
        capture = {"pcap"} if self._capture is not None else set()
        expected = set(LISTENERS) | {"sockdiag"} | capture
        if self.gateway is not None or set(listeners) != expected:
            for sock in listeners.values():
                sock.close()
            raise SetupError("stage 2 sent an unexpected set of gateway sockets")
        if self._capture is not None:
            self._capture_sock = sock = listeners.pop("pcap")
            sock.setblocking(False)
            asyncio.get_running_loop().add_reader(sock.fileno(), self._capture.drain, sock)
        diag = listeners.pop("sockdiag")
        self.gateway = Gateway(
            self.policy, listeners, dns, on_event=self._event, secrets=self.secrets
        )
        if self.asking is not None:
            self.whos = Whos(SockDiag(diag))
            self.gateway.dns_session.ask = self.gateway.ask = self._ask
        else:
            diag.close()
        if self.tailnet:
            self.gateway.dns_session.routes = ((self.tailnet, (tailscale.MAGICDNS,)),)
        self.gateway.start()

    def _event(self, ev: dict[str, Any]) -> None:
        fields = {k: v for k, v in ev.items() if v not in (None, "") and k != "layer"}
        self.record(str(ev.get("layer", "net")), **fields)
        if ev.get("verdict") != "deny":
            return  # (every allowed flow and its close) what follows counts refusals
        self.refused.add(ev)
        if _refused_lookup(ev) and self.gateway is not None:
            # a row in the table for every name the summary line counts as not allowed
            self.gateway.netlog.refused_name(str(ev["name"]))
        if self.spec.verbose and self.notice is not None:
            if self._notices < MAX_NOTICES:
                self._notices += 1
                self.notice(describe(ev))
            else:
                self._muted += 1

    def landlock_refused(self, addr: str, port: int, by: str) -> None:
        """A TCP connect() Landlock refused in the sandbox, named by PID 1 (BY: its
        process; boxyd/stage2/notify.py). No packet left, so the gateway saw nothing:
        a row of the table and a denial as the ruleset's would be, with the flag."""
        if self.gateway is None:
            return
        try:
            names = sorted(self.gateway.bindings.names(addr))
        except ValueError:  # not an address: PID 1 is beside the payload
            return
        host = names[0] if names else None
        allow = f"--allow-host {host}:{port}" if host else f"--allow-port {port}"
        reason = (
            f"Landlock: port {port} is not among the run's ports; {allow} allows it "
            "(in a new run: the kernel's ports are fixed at the start)"
        )
        netlog = self.gateway.netlog
        netlog.conn(self.gateway.t_ms(), "tcp", "deny", addr, port, host, None, reason)
        ev = {"layer": "net.landlock", "verdict": "deny", "proto": "tcp", "addr": addr}
        self._event({**ev, "port": port, "host": host, "by": by, "reason": reason})

    async def finish(self) -> dict[str, Any]:
        """Close every flow; write --net-log; where the network went (Destination rows)."""
        for timer in self._once.values():
            timer.cancel()
        self._once.clear()
        out: dict[str, Any] = {}
        if self._capture is not None:
            out.update(self._close_capture())
        if self.gateway is None:
            return out
        await self.gateway.close()
        if self.whos is not None:
            self.whos.close()
        log_ = self.gateway.netlog
        notes = out.setdefault("notes", [])
        # said without -v: a silent refusal looks like a broken network
        unreported = self.gateway.netlog.unnamed - self.gateway.rate_limited
        notes += self.refused.lines(verbose=self.spec.verbose, unreported=unreported)
        if self._muted:
            notes.append(f"-v: {plural(self._muted, 'more denial')} not shown (see --audit-log)")
        conns, names = log_.dropped()
        if conns or names:  # the policy held for them: only the record is short
            notes.append(
                f"network log: {plural(conns, 'connection')} and {plural(names, 'resolved name')}"
                f" past its bounds ({netlog.MAX_ROWS:,} rows, {netlog.MAX_NAMES:,} names) "
                "counted, not kept"
            )
        if self._netlog_fd is not None:
            try:
                await asyncio.to_thread(netlog.write, self._netlog_fd, log_)
            except OSError as e:
                notes.append(f"--net-log {self.spec.net_log}: not written: {e.strerror}")
            else:
                if replaced(self._netlog_fd):
                    notes.append(
                        f"--net-log {self.spec.net_log}: removed or replaced during the "
                        "run (by the payload?): the log was written to the removed file"
                    )
        out["destinations"] = log_.summary()
        out["refusals"] = self.refused.rows()
        return out

    def change(
        self, change: Change, hosts: list[str], caller: Caller, t: float, answer: str = ""
    ) -> str:
        """Allow or deny HOSTS from now on (docs/design.md, "Changed while it runs"):
        the policy is rebuilt and handed to the gateway, which cuts what it no longer
        allows. Returns the line show and the audit log keep; T: seconds into the run.
        Raises UsageError (nothing changed) for what cannot change."""
        verb = change.value
        if self.gateway is None:
            raise UsageError(f"{verb}: the session's network is not up yet; try again")
        if not hosts or len(hosts) > MAX_HOSTS_PER_CHANGE:
            raise UsageError(f"{verb}: name 1 to {MAX_HOSTS_PER_CHANGE} hosts")
        widen = change is Change.ALLOW
        self.policy = self.policy.widened(hosts) if widen else self.policy.narrowed(hosts)
        cut = self.gateway.set_policy(self.policy)
        for host in hosts:  # decided for good now: no `once` to forget
            with contextlib.suppress(KeyError):
                self._once.pop(host).cancel()
        how = f", answered {answer}" if answer else ""
        line = f"{run_clock(t)} {verb} {' '.join(hosts)} ({caller}{how})"
        if cut:
            line += f": {plural(cut, 'open connection')} cut"
        self.record(
            "net.policy",
            verdict=verb,
            hosts=hosts,
            uid=caller.uid,
            pid=caller.pid,
            via=caller.via,
            cut=cut,
            **({"answer": answer} if answer else {}),
        )
        return line

    def discard(self) -> None:
        """After a run that never started: release what was opened ahead of it."""
        if self._capture is not None and self.gateway is None:
            self._capture = None

    def _close_capture(self) -> dict[str, Any]:
        cap, sock = self._capture, self._capture_sock
        assert cap is not None
        if sock is not None:
            cap.drain(sock, budget=1 << 16)  # what is still queued belongs to the run
            asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()
        self._capture = None
        self.record(
            "net.pcap",
            file=self.spec.pcap,
            frames=cap.frames,
            bytes=cap.written,
            stopped_at_limit=cap.full,
        )
        if cap.full:
            return {
                "notes": [
                    f"--pcap {self.spec.pcap}: stopped at --pcap-max ({cap.frames} frames kept)"
                ]
            }
        return {}


@functools.lru_cache(maxsize=64)
def gateway_ruleset(
    mode: str,
    exceptions: tuple[ranges.Network, ...],
    tcp_ports: tuple[int, ...] | None,
    udp_ports: tuple[int, ...] | None,
    bound: tuple[str, ...] | None = None,
) -> str:
    """The same flags give the same ruleset: built once (~12 ms) and serialised once,
    then reused as the JSON text stage 2 loads (and a spare loads ahead: the text is
    what it compares)."""
    prefixes = ranges.static_prefixes(exceptions)
    rules = ruleset.gateway_ruleset(
        mode=mode,
        deny_v4=prefixes.deny_v4,
        deny_v6=prefixes.deny_v6,
        except_v4=prefixes.accept_v4,
        except_v6=prefixes.accept_v6,
        tcp_ports=None if tcp_ports is None else list(tcp_ports),
        udp_ports=None if udp_ports is None else list(udp_ports),
        bound=None if bound is None else list(bound),
    )
    return json.dumps(rules)


def _plain_names(policy: NetPolicy) -> list[str]:
    """The allowlist's exact host names (no wildcard, no literal address), a few."""
    out = []
    for name in policy.exact:
        try:
            ipaddress.ip_address(name)
        except ValueError:
            out.append(name)
    return out[:PREFLIGHT_NAMES]


def refused_names(events: list[dict[str, Any]]) -> list[str]:
    """One line per name whose answers all lay in refused ranges (DNS events of the
    proxy: 'denied' lists what was removed, 'addrs' what was kept)."""
    removed: dict[str, dict[str, str]] = {}
    kept: set[str] = set()
    for ev in events:
        name = str(ev.get("name") or "")
        if ev.get("addrs"):
            kept.add(name)
        for addr, why in ev.get("denied") or []:
            removed.setdefault(name, {})[str(addr)] = str(why)
    out = []
    for name, addrs in sorted(removed.items()):
        if name in kept:
            continue
        cidrs = " ".join(f"--allow-cidr {a}" for a in sorted(addrs))
        whys = "; ".join(sorted(set(addrs.values())))
        out.append(
            f"{name} resolves to {', '.join(sorted(addrs))} ({whys}), which boxy refuses, "
            f"so the run cannot reach it; if that is really where it lives: {cidrs}"
        )
    return out


def _refused_lookup(ev: dict[str, Any]) -> bool:
    """A DNS lookup refused for its name (not one of answers removed, not a flow)."""
    return (
        ev.get("layer") == "net.dns"
        and ev.get("verdict") == "deny"
        and bool(ev.get("name"))
        and not ev.get("denied")
        and ev.get("proto") not in ("tcp", "udp")
    )


def describe(ev: dict[str, Any]) -> str:
    """One -v line for a denial: layer, what, why."""
    layer = ev.get("layer", "net")
    if ev.get("addr"):
        addr, port = str(ev["addr"]), ev.get("port")
        what = f"{ev.get('proto', 'tcp')}://{f'[{addr}]' if ':' in addr else addr}"
        what += f":{port}" if port else ""
        if ev.get("sni"):
            what += f" (name {ev['sni']})"
        elif ev.get("host"):
            what += f" ({ev['host']})"
    elif ev.get("count"):
        what = plural(int(ev["count"]), "connection")
    else:
        what = str(ev.get("name", "?"))
    return f"{layer} deny {what}: {ev.get('reason') or 'denied'}"


def make_dns_proxy() -> DnsProxy:
    try:
        return DnsProxy(upstream_servers(os.environ.get(UPSTREAM_ENV)))
    except (ValueError, OSError) as e:
        raise SetupError(f"DNS proxy: {e}") from None
