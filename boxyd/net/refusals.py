"""What a run's network refused, in one line at its end — visible without -v (pure:
policy events in, text out). A refusal the user never hears of looks like a broken
network: `npm view` under --profile node on a host whose registry sits in a reserved
range used to fail after a minute with a generic error while the table said nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from boxy.outcome import Refusal
from boxy.values import plural

# Distinct refusals kept as rows for the outcome (a scan of 65,536 ports is that
# many); past it they are counted into one row that says so.
MAX_ROWS = 256
MAX_NAMED = 20  # names not allowed said one per line at the end; the rest counted
MAX_NAMES = 10_000  # names not allowed kept (a payload can ask for millions)
_Key = tuple[str, str, str | None, int | None, str | None, str]
# a net.secret refusal's reason when the swap cut a terminated connection (gateway):
# what follows is why (a request for another Host, h2 …), which is no placeholder sent
SWAP_CUT = "not swapped: "


@dataclass
class Tally:
    """Counted the way the destinations table counts (boxyd.net.netlog), so the two
    agree: every refused connection is a row there, whichever layer refused it (a
    connection refused for want of a DNS binding is layer net.dns, yet a connection),
    and every removed DNS answer adds to its name's DENIED."""

    connections: int = 0  # flows refused (TCP or UDP), at SYN time or after: table rows
    reset: int = 0  # connections reset in bulk by the rate limits: no table row
    names: set[str] = field(default_factory=set)  # names the allowlist does not hold
    names_past: int = 0  # refusals of names past MAX_NAMES: counted, not named
    answers: int = 0  # answers removed, each time one was (as the table counts them)
    removed: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> addr -> why
    kinds: dict[_Key, int] = field(default_factory=dict)  # the rows(), counted
    past: int = 0  # refusals of kinds beyond MAX_ROWS
    # --secret NAME@HOST: (where, why the swap cut it or "": a placeholder sent there)
    # -> how often
    placeholders: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, ev: Mapping[str, Any]) -> None:
        if ev.get("verdict") != "deny":
            return
        self._count(ev)
        if ev.get("layer") == "net.secret":
            where = ev.get("host") or ev.get("sni") or ev.get("addr")
            where = str(where) if where else "a DNS lookup"
            reason = str(ev.get("reason") or "")
            key = (where, reason[len(SWAP_CUT) :] if reason.startswith(SWAP_CUT) else "")
            if key in self.placeholders or len(self.placeholders) < MAX_ROWS:
                self.placeholders[key] = self.placeholders.get(key, 0) + 1
        if ev.get("proto") in ("tcp", "udp"):  # a connection, whatever layer refused it
            if ev.get("addr"):
                self.connections += 1
            else:  # one event for a whole flood (Gateway.close)
                self.reset += int(ev.get("count") or 1)
            return
        if ev.get("layer") != "net.dns":
            return
        denied = ev.get("denied") or []
        if denied:  # an allowed name whose answers pointed into a refused range
            name = str(ev.get("name") or "?")
            self.answers += len(denied)
            for addr, why in denied:
                self.removed.setdefault(name, {})[str(addr)] = str(why)
        elif ev.get("name"):
            name = str(ev["name"]).lower().rstrip(".")
            if name in self.names or len(self.names) < MAX_NAMES:
                self.names.add(name)
            else:
                self.names_past += 1

    def _count(self, ev: Mapping[str, Any]) -> None:
        port = ev.get("port")
        key: _Key = (
            str(ev.get("layer") or "net"),
            str(ev.get("proto") or ("dns" if ev.get("layer") == "net.dns" else "")),
            str(ev["addr"]) if ev.get("addr") else None,
            port if type(port) is int else None,
            str(ev.get("host") or ev.get("sni") or ev.get("name") or "") or None,
            str(ev.get("reason") or ""),
        )
        n = int(ev.get("count") or 1)  # a flood's reset comes as one event
        if key in self.kinds or len(self.kinds) < MAX_ROWS:
            self.kinds[key] = self.kinds.get(key, 0) + n
        else:
            self.past += n

    def rows(self) -> list[Refusal]:
        """Each kind of refusal once, with its count, most frequent first (then in
        the order they came); past MAX_ROWS kinds, one row counts the rest."""
        order = sorted(self.kinds.items(), key=lambda kv: -kv[1])  # stable: first seen first
        out = [Refusal(*key, count=n) for key, n in order]
        if self.past:
            why = f"more kinds of refusal than the {MAX_ROWS} listed (--audit-log has each)"
            out.append(Refusal("net", "", None, None, None, why, self.past))
        return out

    def lines(self, *, verbose: bool = False, unreported: int = 0) -> list[str]:
        """One summary line when anything was refused, then one per name whose every
        answer was removed, saying which --allow-cidr would open it. VERBOSE: the run
        had -v, so each refusal was said already (never "-v for details" to a -v run).
        UNREPORTED: refusals the ruleset counted past its reports (a flood)."""
        parts = []
        if self.connections:
            parts.append(f"{plural(self.connections, 'connection')} refused")
        if unreported:
            parts.append(
                f"{plural(unreported, 'more connection')} refused past the report rate "
                "(counted, not named)"
            )
        if self.reset:
            parts.append(f"{plural(self.reset, 'connection')} reset over the rate limits")
        if self.names:
            many = "at least " if self.names_past else ""
            parts.append(f"{many}{plural(len(self.names), 'name')} not allowed")
        if self.answers:
            parts.append(f"{plural(self.answers, 'DNS answer')} in a refused range removed")
        if not parts and not self.placeholders:
            return []
        where = "each one said above" if verbose else "-v or --audit-log for details"
        out = [", ".join(parts) + f" ({where})"] if parts else []
        for (dest, cut), n in self.placeholders.items():  # a denial of its own, always said
            times = f" ({plural(n, 'time')})" if n > 1 else ""
            if cut:  # the swap's own words: what it could not read, never a byte sent
                out.append(f"a connection to {dest} was cut by the secret swap: {cut}{times}")
            else:
                out.append(f"a secret's placeholder was sent to {dest}: refused{times}")
        for name, addrs in sorted(self.removed.items()):
            cidrs = " ".join(f"--allow-cidr {a}" for a in sorted(addrs))
            whys = sorted(set(addrs.values()))
            out.append(
                f"{name} answered with {', '.join(sorted(addrs))} ({'; '.join(whys)}), "
                f"which boxy refuses; if that is really where it lives: {cidrs}"
            )
        # one line per name, with the flag that allows it: what an agent reading the
        # run's end (the hook's runs) tells its user, instead of retrying (issue 34 §3)
        names = sorted(self.names)
        out += [
            f"{n}: not on the allowlist; --allow-host {n} allows it "
            "(a running session: boxyctl allow ID " + n + ")"
            for n in names[:MAX_NAMED]
        ]
        if len(names) > MAX_NAMED:
            out.append(f"and {plural(len(names) - MAX_NAMED, 'more name')} not allowed")
        return out
