"""The per-flow egress decision (pure: no I/O, no clock, no binding table).

``NetPolicy`` is built once per run from the spec and answers one question per
event; the gateway supplies what it has seen (the destination, the names the
session's DNS answers bound to that address, the SNI or Host it peeked) and
reports the ``Verdict``. The order is docs/design.md, "Policy, in order":

1. Address ranges, in every mode (``boxyd.net.ranges``; NAT64, 6to4, mapped,
   compatible and Teredo decoded first). ``--allow-cidr`` prefixes and, with
   ``--tailscale``, the tailnet's ranges are the exceptions.
2. DNS bindings (allowlist mode): a flow needs a live binding whose name is
   allowed. ``--allow-cidr`` and ``--tailscale`` lift the range objection and
   nothing else: an address inside an opened prefix still needs a binding, like
   a public one. A device reached by its literal address is named as itself,
   ``--allow-host 192.168.4.7:22``: that address is its own binding (no name on
   the wire is asked of it) and allows that one address only.
3. SNI / Host: the name on the wire must be allowed on that port *and* bound to
   the address. Bytes that are neither TLS nor HTTP pass only for hosts allowed
   with explicit ports (``--allow-host nas:22``). ECH is refused in every mode.
4. Ports: ``HOST:PORT[,PORT]`` keeps those ports to that host; a host without
   ports gets the global list (``--allow-port``, or 80 and 443 when none given).
5. UDP (allowlist mode): only ``HOST:PORT/udp`` pairs with a binding; UDP/443
   (QUIC) is refused outright, so clients fall back to TCP where the name is seen.

Public mode: whatever passes step 1, any port, TCP or UDP (QUIC included); names
are not checked and no binding is needed — but ECH is still refused.

Names are compared case-insensitively with the trailing dot ignored;
``*.example.com`` matches every name strictly below example.com, not
example.com itself. Every refusal carries a short reason for the logs.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from boxy.errors import UsageError
from boxy.values import HostSpec, parse_cidr, parse_denied_host, parse_host_spec
from boxyd.net.bindings import canonical_ip
from boxyd.net.ranges import SANDBOX_NETS, TAILSCALE_NETS, Address, Network, classify, denied

# Audit-log layers (docs/design.md, "Network").
IP, DNS, SNI, PORT = "net.ip", "net.dns", "net.sni", "net.port"

# The gateway's own addresses on the sandbox link (boxyd.net.ruleset GATEWAY_V4/V6);
# only these are "the gateway". The rest of the link is the sandbox's own.
GATEWAY_ADDRS = frozenset({ipaddress.ip_address("10.0.2.2"), ipaddress.ip_address("fd00::2")})
GATEWAY_ITSELF = "the gateway itself is not a destination"
OWN_LINK = "the sandbox's own link"
# the ruleset refused an address that had no DNS binding when its packet came
DENIED_ADDRESS = "address denied while the session runs (boxyctl deny)"
UNBOUND_WHEN_SENT = "no DNS binding for this address when it was sent (hard-coded IP?)"

DEFAULT_PORTS = (80, 443)
DNS_PORT = 53
QUIC_PORT = 443


@dataclass(frozen=True)
class Verdict:
    """One decision: allowed or not, the layer that decided, and why (empty when allowed)."""

    allow: bool
    layer: str  # IP, DNS, SNI or PORT
    reason: str = ""


# A first record that names no host passes only for a host allowed with that port: the
# refusal's hint (net/denial.py) then names the port too.
EXPLICIT_PORT_ONLY = "only a host allowed with :"
# The gateway reports this when a ClientHello carries encrypted_client_hello: the
# name it shows is only the outer one, so the name check would be meaningless.
ECH_REFUSED = Verdict(False, SNI, "ECH refused (the real server name is encrypted)")


@dataclass(frozen=True)
class _Ports:
    """What one name may reach: explicit TCP ports, the global list, UDP ports."""

    tcp: frozenset[int] = frozenset()
    tcp_global: bool = False  # named without ports: the global list applies
    udp: frozenset[int] = frozenset()

    def __or__(self, other: _Ports) -> _Ports:
        return _Ports(
            self.tcp | other.tcp, self.tcp_global or other.tcp_global, self.udp | other.udp
        )


def _norm(name: str) -> str:
    return name.strip().lower().removesuffix(".")


_ADDRESS_CACHE = 4096  # addresses whose verdict a policy keeps


@dataclass(frozen=True)
class NetPolicy:
    """The network policy of one run. Build it with ``from_spec``."""

    mode: Literal["public", "allowlist"]
    global_ports: frozenset[int] = frozenset(DEFAULT_PORTS)
    exceptions: tuple[Network, ...] = ()  # --allow-cidr, plus the tailnet's with --tailscale
    # name → ports, and ".example.com" → ports for *.example.com. Never mutated after
    # from_spec; left out of the hash since a dict has none.
    exact: dict[str, _Ports] = field(default_factory=dict, hash=False)
    wildcards: dict[str, _Ports] = field(default_factory=dict, hash=False)
    # names refused while the session runs (`boxyctl deny`): exact names, "*.suffix"
    # forms and literal addresses; they win over any rule that would allow them
    refused_names: frozenset[str] = frozenset()
    # address → its range verdict: asked several times per flow (accept, first record)
    # and the same few addresses recur; the ranges and exceptions never change.
    _by_address: dict[Address | str, Verdict] = field(
        default_factory=dict, init=False, compare=False, hash=False, repr=False
    )

    @classmethod
    def from_spec(
        cls,
        mode: str,
        allow_hosts: Iterable[str] = (),
        allow_ports: Iterable[int] = (),
        allow_cidrs: Iterable[str] = (),
        tailscale: bool = False,
    ) -> NetPolicy:
        """Check and compile a run's network flags (RunSpec.net, allow_hosts, …).

        ``allow_hosts`` are ``HostSpec`` strings (``nas:22``, ``*.example.com``,
        ``dns.example:5353/udp``); ``allow_cidrs`` single prefixes. Everything is
        re-parsed with ``boxy.values``, so a bad value raises ``UsageError`` here as
        it would on the command line. ``--allow-port`` means nothing in public mode
        (every port is open) and is ignored there.
        """
        if mode not in ("public", "allowlist"):
            raise UsageError(f"--net: {mode!r} has no gateway policy (public or allowlist)")
        hosts = [parse_host_spec(h) for h in allow_hosts]
        if hosts and mode == "public":
            raise UsageError("--allow-host: cannot be combined with --net public")
        ports = []
        for port in allow_ports:
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise UsageError(f"--allow-port: {port!r} is not a port number (1–65535)")
            ports.append(port)
        cidrs = tuple(ipaddress.ip_network(parse_cidr(c)) for c in allow_cidrs)
        exceptions = cidrs + (TAILSCALE_NETS if tailscale else ())
        exact, wildcards = _rules(hosts, exceptions, {}, {}, what="--allow-host")
        return cls(
            mode="public" if mode == "public" else "allowlist",
            global_ports=frozenset(ports or DEFAULT_PORTS),
            exceptions=exceptions,
            exact=exact,
            wildcards=wildcards,
        )

    # --- changed while the session runs (`boxyctl allow` / `deny`, issue 34) ----

    def widened(self, hosts: Iterable[str]) -> NetPolicy:
        """This policy with HOSTS (``HostSpec`` strings) allowed too. A range objection
        stays (--allow-cidr is fixed at the start), and so do the ports the kernel was
        given at the start: a TCP port outside Landlock's set, or a UDP port outside the
        ruleset's, is refused naming the run that would allow it. Raises UsageError."""
        if self.mode != "allowlist":
            raise UsageError("allow: the session runs --net public: every public host is allowed")
        specs = [parse_host_spec(h, what="allow") for h in hosts]
        exact, wildcards = _rules(
            specs, self.exceptions, dict(self.exact), dict(self.wildcards), what="allow"
        )
        added = {_unmapped(_norm(s.host)) for s in specs}
        new = NetPolicy(
            self.mode,
            self.global_ports,
            self.exceptions,
            exact,
            wildcards,
            self.refused_names - added,
        )
        for what, before, after in (
            ("TCP", self.landlock_ports(), new.landlock_ports()),
            ("UDP", self.udp_ports(), new.udp_ports()),
        ):
            extra = sorted(set(after or ()) - set(before or ()))
            if extra:
                fixed = ", ".join(map(str, before or ())) or "none"
                raise UsageError(
                    f"allow: {what} port {', '.join(map(str, extra))}: the session's "
                    f"{'Landlock rules' if what == 'TCP' else 'ruleset'} fixed its {what} "
                    f"ports at its start ({fixed}); a new run with "
                    f"{' '.join('--allow-host ' + str(s) for s in specs)} allows it"
                )
        for spec in specs:  # a name under a denied *.suffix would stay refused: say so
            name = _unmapped(_norm(spec.host))
            if not name.startswith("*.") and _is_denied(name, new.refused_names):
                cover = next(
                    d for d in sorted(new.refused_names) if _is_denied(name, frozenset({d}))
                )
                raise UsageError(
                    f"allow: {name} is under the denied {cover}, which wins; "
                    f"`boxyctl allow ID '{cover}'` lifts that denial"
                )
        return new

    def narrowed(self, hosts: Iterable[str]) -> NetPolicy:
        """This policy with HOSTS (names, ``*.suffix`` forms or literal addresses, no
        ports) refused from now on, even below an allowed wildcard. Raises UsageError."""
        if self.mode != "allowlist":
            raise UsageError(
                "deny: the session runs --net public, where a hard-coded address reaches "
                "any public host: refusing a name needs --net allowlist"
            )
        specs = [parse_denied_host(h) for h in hosts]
        names = {_unmapped(_norm(s.host)) for s in specs}
        exact = {k: v for k, v in self.exact.items() if _unmapped(k) not in names}
        wildcards = {
            k: v for k, v in self.wildcards.items() if "*" + k not in names
        }  # "*.x" was kept as ".x"
        return NetPolicy(
            self.mode,
            self.global_ports,
            self.exceptions,
            exact,
            wildcards,
            self.refused_names | names,
        )

    def forgetting(self, hosts: Iterable[str]) -> NetPolicy:
        """This policy without the exact names HOSTS were allowed as (--ask's `once`
        ending): asked about again, not refused. Nothing else changes."""
        names = {_unmapped(_norm(parse_host_spec(h, what="allow").host)) for h in hosts}
        exact = {k: v for k, v in self.exact.items() if k not in names}
        return NetPolicy(
            self.mode, self.global_ports, self.exceptions, exact, self.wildcards,
            self.refused_names,
        )  # fmt: skip

    # --- names ---------------------------------------------------------------

    def _ports_for(self, name: str) -> _Ports | None:
        """The union of every rule matching ``name`` (already normalised), or None."""
        if self.refused_names and _is_denied(name, self.refused_names):
            return None
        found = self.exact.get(name)
        for suffix, ports in self.wildcards.items():
            if name.endswith(suffix):  # suffix is ".example.com": strictly below
                found = ports if found is None else found | ports
        return found

    def _tcp_ports(self, name: str) -> frozenset[int]:
        p = self._ports_for(name)
        if p is None:
            return frozenset()
        return p.tcp | self.global_ports if p.tcp_global else p.tcp

    def dns(self, name: str) -> Verdict:
        """May ``name`` be resolved upstream? Public: always. Allowlist: if any rule
        matches it, whatever its ports or protocol."""
        if self.mode == "public" or self._ports_for(_norm(name)) is not None and not _literal(name):
            return Verdict(True, DNS)
        return Verdict(False, DNS, "hostname not on the allowlist")

    def refuses(self, name: str) -> bool:
        """NAME (an SNI, a Host header's value, a bound name or a literal address) is
        allowed on no port: a flow decided by it is cut when the policy changes."""
        return self.mode == "allowlist" and self._ports_for(_host_header_name(name)) is None

    def name_allowed(self, name: str) -> bool:
        """``dns(name).allow``."""
        return self.dns(name).allow

    def name_denied(self, name: str) -> bool:
        """NAME was denied while the session runs (`boxyctl deny`): the DNS proxy
        refuses an answer whose CNAME chain passes through it."""
        return bool(self.refused_names) and _is_denied(_norm(name), self.refused_names)

    # --- addresses -----------------------------------------------------------

    def address(self, ip: Address | str) -> Verdict:
        """The range check alone (every mode): also what filters DNS answers (rebinding)."""
        v = self._by_address.get(ip)
        if v is None:
            reason = self.address_denied(ip)
            v = Verdict(False, IP, reason) if reason else Verdict(True, IP)
            if len(self._by_address) >= _ADDRESS_CACHE:
                self._by_address.clear()
            self._by_address[ip] = v
        return v

    def address_denied(self, ip: Address | str) -> str | None:
        """Why ``ip`` is refused by range, or None (``dnsfilter.DnsPolicy``'s question).
        An address `boxyctl deny` named is refused on every port, whatever name it is
        reached by (a name bound to it, its literal)."""
        if self.refused_names and _unmapped(str(ip)) in self.refused_names:
            return DENIED_ADDRESS
        return denied(ip, self.exceptions)

    def _bound(self, ip: Address | str, bound_names: Iterable[str]) -> list[str]:
        """The names bound to IP, plus IP itself when it was allowed as a literal host
        (an IPv4-mapped address counts as its IPv4 address: the same socket target)."""
        names = {_norm(n) for n in bound_names}
        lit = self._literal_for(ip)
        if lit is not None:
            names.add(lit)
        return sorted(names)

    def _literal_for(self, ip: Address | str) -> str | None:
        addr = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        key = str(addr)
        return key if key in self.exact else None

    def tcp_connect(self, ip: Address | str, port: int, bound_names: Iterable[str]) -> Verdict:
        """At accept time, before any byte is read.

        Allowlist: some bound name must be allowed on ``port`` (its explicit ports,
        or the global list when it was named without ports).
        """
        verdict = self.address(ip)
        if not verdict.allow or self.mode == "public":
            return verdict
        names = self._bound(ip, bound_names)
        if any(port in self._tcp_ports(n) for n in names):
            return Verdict(True, DNS)
        return self._refusal(names, port, "TCP")

    def _refusal(self, names: list[str], port: int, proto: str) -> Verdict:
        if not names:
            return Verdict(False, DNS, "no DNS binding for this address (hard-coded IP?)")
        allowed = [n for n in names if self._ports_for(n) is not None]
        if not allowed:
            return Verdict(False, DNS, "hostname not on the allowlist")
        what = "port" if proto == "TCP" else "UDP port"
        return Verdict(False, PORT, f"{what} {port} not allowed for {', '.join(allowed)}")

    def tcp_name(
        self,
        ip: Address | str,
        port: int,
        name: str,
        bound_names: Iterable[str],
        *,
        kind: Literal["sni", "host"] = "sni",
    ) -> Verdict:
        """The TLS SNI or the plaintext HTTP Host header, once peeked.

        Allowlist: the name must be allowed on ``port`` and be one of the names bound
        to ``ip`` — so an allowed name sent to another host's address, and an
        unlisted name sent to an allowed host's shared CDN address, are both
        refused. A Host header's ":port" is ignored. A ClientHello without SNI is
        judged as opaque bytes. An address allowed as a literal host is its own
        name: what the client writes on the wire is not asked of it. Public: allowed.
        """
        verdict = self.address(ip)
        if not verdict.allow or self.mode == "public":
            return verdict
        lit = self._literal_for(ip)
        if lit is not None and port in self._tcp_ports(lit):
            return Verdict(True, DNS)
        label = "SNI" if kind == "sni" else "Host"
        wire = _host_header_name(name) if kind == "host" else _norm(name)
        if not wire:
            opaque = self.tcp_opaque(ip, port, bound_names)
            if opaque.allow or opaque.layer != SNI:  # SNI: only the explicit port was missing
                return opaque
            missing = "TLS without SNI" if kind == "sni" else "HTTP without Host"
            return Verdict(False, SNI, f"{missing}: {EXPLICIT_PORT_ONLY}{port} takes that")
        if self._ports_for(wire) is None:
            return Verdict(False, SNI, f"{label} names {wire}: hostname not on the allowlist")
        if wire not in {_norm(n) for n in bound_names}:
            return Verdict(False, SNI, f"{label} names {wire}, not bound to this address")
        if port not in self._tcp_ports(wire):
            return Verdict(False, PORT, f"port {port} not allowed for {wire}")
        return Verdict(True, SNI)

    def askable(self, name: str, kind: Literal["sni", "host"] = "sni") -> str | None:
        """--ask: NAME (a TLS SNI, an HTTP Host header's value) as tcp_name reads it,
        when the allowlist holds no rule for it: a name the user may be asked about.
        None for a name allowed, one `deny` refused (never asked again: denied is
        denied) or an address."""
        if self.mode != "allowlist":
            return None
        wire = _host_header_name(name) if kind == "host" else _norm(name)
        if not wire or _literal(wire) or self.name_denied(wire):
            return None
        return wire if self._ports_for(wire) is None else None

    def tcp_opaque(self, ip: Address | str, port: int, bound_names: Iterable[str]) -> Verdict:
        """First bytes neither TLS nor HTTP: the binding alone decides, and only for a
        host allowed with ``port`` listed explicitly (``--allow-host nas:22``), since no
        name on the wire narrows a shared address — or for an address allowed as a
        literal host, on any of its ports (it is its own name). Public: allowed."""
        verdict = self.address(ip)
        if not verdict.allow or self.mode == "public":
            return verdict
        lit = self._literal_for(ip)
        if lit is not None and port in self._tcp_ports(lit):
            return Verdict(True, DNS)
        names = self._bound(ip, bound_names)
        for n in names:
            p = self._ports_for(n)
            if p is not None and port in p.tcp:
                return Verdict(True, DNS)
        if any(port in self._tcp_ports(n) for n in names):
            return Verdict(
                False, SNI, f"neither TLS nor HTTP on port {port}: allow the host with :{port}"
            )
        return self._refusal(names, port, "TCP")

    def udp(self, ip: Address | str, port: int, bound_names: Iterable[str]) -> Verdict:
        """A UDP flow (DNS never comes here: port 53 is the gateway's own resolver).

        Allowlist: only a bound name given as ``HOST:PORT/udp`` with this port;
        UDP/443 is QUIC and always refused. Public: anything past the range check.
        """
        verdict = self.address(ip)
        if not verdict.allow or self.mode == "public":
            return verdict
        if port == QUIC_PORT:
            return Verdict(False, PORT, "QUIC refused in allowlist mode (clients fall back to TCP)")
        names = self._bound(ip, bound_names)
        for n in names:
            p = self._ports_for(n)
            if p is not None and port in p.udp:
                return Verdict(True, DNS)
        return self._refusal(names, port, "UDP")

    def early_refusal(
        self, ip: Address | str, proto: str, port: int, bound_names: Iterable[str]
    ) -> Verdict:
        """Why the gateway's ruleset refused a packet before boxyd saw it (NFLOG), in
        the words boxyd's own checks use: each address named by its range (link-local /
        cloud metadata, multicast …), only the gateway's two addresses as the gateway.
        Always a refusal: the ruleset already refused it."""
        addr = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
        if addr in GATEWAY_ADDRS:
            return Verdict(False, IP, GATEWAY_ITSELF)
        if any(addr in net for net in SANDBOX_NETS):
            return Verdict(False, IP, OWN_LINK)
        v = self.address(addr)
        if v.allow and proto == "tcp":
            v = self.tcp_connect(addr, port, bound_names)
        elif v.allow and proto == "udp":
            v = self.udp(addr, port, bound_names)
        if not v.allow:
            return v
        # boxyd's checks allow now what the ruleset refused then. Its own check of local,
        # broadcast and multicast destinations refuses whatever an exception opened:
        # name that range. Otherwise, in allowlist mode, the address had no binding
        # when the packet came: one appeared since (another name's, in the same moment),
        # and the range's name would not be the check that refused (issue 33 §1).
        if addr.is_multicast or str(addr) == "255.255.255.255":
            return Verdict(False, IP, classify(addr) or "multicast or broadcast")
        if self.mode == "allowlist":
            return Verdict(False, DNS, UNBOUND_WHEN_SENT)
        why = classify(addr)
        return Verdict(False, IP, why or "refused by the gateway's ruleset")

    def literal_addresses(self) -> list[str]:
        """Addresses allowed as literal hosts (``--allow-host 192.168.4.7:22``): bound
        for the whole run, with no DNS answer to bind them."""
        return sorted(name for name in self.exact if _literal(name))

    def udp_ports(self) -> list[int] | None:
        """Allowlist: the only UDP ports any host may be reached on (``HOST:PORT/udp``),
        so the gateway refuses every other one at once (port unreachable) instead of
        letting the client wait. Public: None (any port)."""
        if self.mode == "public":
            return None
        rules = list(self.exact.values()) + list(self.wildcards.values())
        return sorted(set().union(*(p.udp for p in rules)) - {QUIC_PORT})

    def landlock_ports(self) -> list[int] | None:
        """The TCP ports the payload may connect() to, for the Landlock backstop.

        Allowlist: 53 (DNS over TCP to the gateway), every explicit TCP port, and
        the global list when a host without ports uses it.
        Landlock filters by port only and covers loopback too. Public: None (not
        handled at all).
        """
        if self.mode == "public":
            return None
        rules = list(self.exact.values()) + list(self.wildcards.values())
        ports = {DNS_PORT}
        for p in rules:
            ports |= p.tcp
        if any(p.tcp_global for p in rules):
            ports |= self.global_ports
        return sorted(ports)


def _rules(
    specs: Iterable[HostSpec],
    exceptions: tuple[Network, ...],
    exact: dict[str, _Ports],
    wildcards: dict[str, _Ports],
    *,
    what: str,
) -> tuple[dict[str, _Ports], dict[str, _Ports]]:
    """SPECS added into EXACT and WILDCARDS (name → ports, ".suffix" → ports), checked
    as the command line checks them: a literal address in a denied range, QUIC."""
    specs = list(specs)
    for spec in specs:
        if _literal(spec.host) and (why := denied(spec.host, exceptions)):
            lift = (
                f"open it with --allow-cidr {spec.host} as well"
                if what.startswith("--")
                else f"only a new run with --allow-cidr {spec.host} opens it"
            )
            raise UsageError(f"{what} {spec}: the address is in a denied range ({why}); {lift}")
    for spec in specs:
        if spec.udp and QUIC_PORT in spec.ports:
            raise UsageError(
                f"{what}: {spec}: QUIC (UDP/443) is refused in allowlist mode; "
                "clients fall back to TCP/443"
            )
        if spec.udp:
            entry = _Ports(udp=frozenset(spec.ports))
        elif spec.ports:
            entry = _Ports(tcp=frozenset(spec.ports))
        else:
            entry = _Ports(tcp_global=True)
        table, key = (
            (wildcards, spec.host[1:]) if spec.host.startswith("*.") else (exact, spec.host)
        )
        table[key] = table.get(key, _Ports()) | entry
    return exact, wildcards


def _is_denied(name: str, denied: frozenset[str]) -> bool:
    """NAME (normalised) is one `boxyctl deny` named, or below a "*.suffix" it named."""
    if name in denied:
        return True
    return any(d.startswith("*.") and name.endswith(d[1:]) for d in denied)


def _unmapped(host: str) -> str:
    """An address literal in its canonical form (an IPv4-mapped IPv6 address as its
    IPv4 address: the same socket target); any other text as it is."""
    try:
        return str(canonical_ip(host))
    except ValueError:
        return host


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _host_header_name(value: str) -> str:
    """'Example.com:8080' → 'example.com'; '[::1]:80' → '::1'."""
    text = value.strip()
    if text.startswith("["):
        return text[1:].partition("]")[0].lower()
    if text.count(":") == 1:
        text = text.partition(":")[0]
    return _norm(text)
