"""The ``--net-log FILE`` record of a run's network, and the destinations table boxy
prints after every run that had network.

Pure but for ``write``. The file is one JSON object:

    {"version": 1,
     "conn_fields": ["t_ms","proto","verdict","addr","port","host","sni","reason","up","down"],
     "strings": ["registry.example", "104.16.1.34", ...],
     "conns": [[289, "tcp", "allow", 1, 443, 0, 0, -1, 2941, 24212], ...],
     "resolutions": {"registry.example": ["104.16.1.34", ...]},
     "summary_fields": ["destination","conns","denied","addrs","sent","received"],
     "summary": [["registry.example", 14, 0, 3, 39321, 6396313], ...],
     "names_denied": {"c2.example.net": 2},
     "unnamed": 0,
     "exact": true,
     "dropped": {"conns": 0, "names": 0}}

- Every conn row has exactly the shape of ``conn_fields``. ``addr``, ``host``, ``sni``
  and ``reason`` are indexes into ``strings`` (each string is stored once), -1 for
  none; ``proto`` is "tcp" or "udp"; ``t_ms`` is milliseconds since the run began;
  ``up``/``down`` are bytes sent to / received from the far end.
- ``host`` is the name boxy bound to the address (from its own DNS answers);
  ``sni`` is the name the client asked for (ClientHello or HTTP Host).
- Verdicts: "allow" (relayed), "deny" (refused by policy), "error" (allowed, but
  the far end could not be reached; ``reason`` says why). Only "allow" rows carry
  bytes: the others are final when recorded.
- ``summary`` has one row per destination: boxy's name for the address when it has
  one, else the address. Never the SNI: that is the client's claim, and a hostile
  one would otherwise file its traffic under a trusted name.
- Names and connections are counted apart: ``names_denied`` holds each name boxy
  refused (a lookup of a name not allowed, or an answer whose every address was
  removed for pointing into a refused range) with how many times; such a name is no destination, for no
  connection was made to it. ``unnamed`` counts refused connections nothing said
  the destination of (the ruleset counted them past its rate-bounded reports, or
  they were reset at the accept rate): they are in the totals, in no row. ``exact``
  is false when a count could not be read: the totals are then lower bounds.

Memory is bounded for a run that makes millions of connections or resolves
millions of names: past ``max_rows`` conns are still counted in the summary but
get no row, and past ``max_names`` resolved names are not recorded; ``dropped``
says how many of each were left out. Past ``max_destinations`` destinations, new
ones are summed in one ``(other)`` summary row. A name keeps at most
``max_addrs_per_name`` addresses; a destination counts at most
``MAX_ADDRS_PER_DESTINATION`` distinct ones.
"""

from __future__ import annotations

import json
import os

from boxy import outcome
from boxy.outcome import Counters, Destination

VERSION = 1
CONN_FIELDS = ("t_ms", "proto", "verdict", "addr", "port", "host", "sni", "reason", "up", "down")
SUMMARY_FIELDS = ("destination", "conns", "denied", "addrs", "sent", "received")
PROTOS = frozenset({"tcp", "udp"})
VERDICTS = frozenset({"allow", "deny", "error"})
NONE = -1  # the index of a missing string

MAX_ROWS = 100_000
MAX_NAMES = 10_000
MAX_ADDRS_PER_NAME = 256
MAX_DESTINATIONS = 10_000
MAX_ADDRS_PER_DESTINATION = 1024
OTHER = "(other)"  # cannot be a host name or an address

_I_UP, _I_DOWN = CONN_FIELDS.index("up"), CONN_FIELDS.index("down")


class _Dest:
    __slots__ = ("conns", "denied", "addrs", "sent", "received")

    def __init__(self) -> None:
        self.conns = self.denied = self.sent = self.received = 0
        self.addrs: set[str] = set()


class _Open:
    """An allowed conn whose byte counts may still change."""

    __slots__ = ("dest", "row", "up", "down")

    def __init__(self, dest: _Dest, row: list[int | str] | None) -> None:
        self.dest, self.row, self.up, self.down = dest, row, 0, 0


class NetLog:
    """Everything a run's network did, kept in the shape the file is written in."""

    def __init__(
        self,
        *,
        max_rows: int = MAX_ROWS,
        max_names: int = MAX_NAMES,
        max_addrs_per_name: int = MAX_ADDRS_PER_NAME,
        max_destinations: int = MAX_DESTINATIONS,
    ) -> None:
        self._max_rows = max_rows
        self._max_names = max_names
        self._max_addrs_per_name = max_addrs_per_name
        self._max_destinations = max_destinations
        self._strings: list[str] = []
        self._index: dict[str, int] = {}
        self._rows: list[list[int | str]] = []
        self._resolutions: dict[str, list[str]] = {}
        self._dests: dict[str, _Dest] = {}
        self._open: dict[int, _Open] = {}
        self._conns = 0
        self._dropped_rows = 0
        self._dropped_names = 0
        self._names_denied: dict[str, int] = {}  # name -> refusals (lookups, answers)
        self._names_past = 0  # refusals of names past max_names: counted, not named
        # Refusals of connections counted where nothing said where they went (the
        # ruleset's counter past the NFLOG reports, resets at the accept rate): in the
        # totals, in no row. Set by the gateway, which knows both halves.
        self.unnamed = 0
        self.exact = True  # False when a count could not be read (then a lower bound)

    def conn(
        self,
        t_ms: int,
        proto: str,
        verdict: str,
        addr: str,
        port: int,
        host: str | None = None,
        sni: str | None = None,
        reason: str | None = None,
    ) -> int:
        """Record one connection; returns its handle for ``update``."""
        if proto not in PROTOS:
            raise ValueError(
                f"net log: unknown protocol {proto!r} (expected one of {sorted(PROTOS)})"
            )
        if verdict not in VERDICTS:
            raise ValueError(
                f"net log: unknown verdict {verdict!r} (expected one of {sorted(VERDICTS)})"
            )
        if not 0 <= port <= 65535:
            raise ValueError(f"net log: port {port} is out of range")
        handle = self._conns
        self._conns += 1
        dest = self._dest(host or addr)
        dest.conns += 1
        dest.denied += verdict == "deny"
        if len(dest.addrs) < MAX_ADDRS_PER_DESTINATION:
            dest.addrs.add(addr)
        row: list[int | str] | None = None
        if len(self._rows) < self._max_rows:
            row = [int(t_ms), proto, verdict, self._intern(addr), port]
            row += [self._intern(host), self._intern(sni), self._intern(reason), 0, 0]
            self._rows.append(row)
        else:
            self._dropped_rows += 1
        if verdict == "allow":
            self._open[handle] = _Open(dest, row)
        return handle

    def update(self, handle: int, up: int, down: int, *, final: bool = False) -> None:
        """Bytes sent and received so far on an allowed conn (totals, not increments).

        ``final`` marks the conn closed; its handle is then released, so call it
        once per conn (a conn never finalised keeps a few dozen bytes alive).
        """
        flow = self._open.get(handle)
        if flow is None:
            raise KeyError(f"net log: conn {handle} is not an open, allowed connection")
        if up < flow.up or down < flow.down:
            raise ValueError(
                f"net log: byte counts of conn {handle} went down "
                f"({flow.up}/{flow.down} → {up}/{down}); pass totals, not increments"
            )
        flow.dest.sent += up - flow.up
        flow.dest.received += down - flow.down
        flow.up, flow.down = up, down
        if flow.row is not None:
            flow.row[_I_UP], flow.row[_I_DOWN] = up, down
        if final:
            del self._open[handle]

    def removed(self, name: str, count: int) -> None:
        """COUNT answers for NAME removed, every one it had (they pointed into a refused
        range): NAME is a name denied, though no connection was ever tried (no
        destination row). The gateway calls it only when no answer was kept."""
        self._deny_name(name, count)

    def refused_name(self, name: str) -> None:
        """A lookup of NAME refused (not on the allowlist): a name denied, counted apart
        from connections (the end-of-run line says it, boxyd.net.refusals)."""
        self._deny_name(name, 1)

    def _deny_name(self, name: str, count: int) -> None:
        name = name.lower().rstrip(".")
        if name in self._names_denied or len(self._names_denied) < self._max_names:
            self._names_denied[name] = self._names_denied.get(name, 0) + count
        else:
            self._names_past += count

    def resolution(self, name: str, addrs: list[str] | tuple[str, ...]) -> None:
        """Addresses boxy's resolver answered NAME with (a union over the run, in order)."""
        known = self._resolutions.get(name)
        if known is None:
            if len(self._resolutions) >= self._max_names:
                self._dropped_names += 1
                return
            known = self._resolutions[name] = []
        for addr in addrs:
            if len(known) >= self._max_addrs_per_name:
                break
            if addr not in known:
                known.append(addr)

    def totals(self) -> Counters:
        """What the network did so far. Connections and denials include the refusals
        counted without a row (``unnamed``); names denied are counted apart from them;
        ``exact`` is False when a count may be short (then a lower bound)."""
        conns = denied = sent = received = 0
        for d in self._dests.values():
            conns, denied = conns + d.conns, denied + d.denied
            sent, received = sent + d.sent, received + d.received
        return Counters(
            conns + self.unnamed,
            denied + self.unnamed,
            sent,
            received,
            len(self._dests),
            len(self._names_denied),
            self._all_counted(),
        )

    def _all_counted(self) -> bool:
        """Every count exact: the counter was read, no name past the bound."""
        return self.exact and not self._names_past

    def dropped(self) -> tuple[int, int]:
        """Connections and resolved names past the log's bounds: counted, not kept."""
        return self._dropped_rows, self._dropped_names

    def summary(self) -> list[Destination]:
        """One row per destination, most connections first, then by name."""
        rows = [
            Destination(name, d.conns, d.denied, len(d.addrs), d.sent, d.received)
            for name, d in self._dests.items()
        ]
        rows.sort(key=lambda r: (-r.connections, r.name))
        return rows

    def to_json(self) -> dict[str, object]:
        """The file's content (a fresh structure; later calls do not change it)."""
        return {
            "version": VERSION,
            "conn_fields": list(CONN_FIELDS),
            "strings": list(self._strings),
            "conns": [list(row) for row in self._rows],
            "resolutions": {name: list(addrs) for name, addrs in self._resolutions.items()},
            "summary_fields": list(SUMMARY_FIELDS),
            "summary": [
                [d.name, d.connections, d.denied, d.addresses, d.bytes_up, d.bytes_down]
                for d in self.summary()
            ],
            "names_denied": dict(sorted(self._names_denied.items())),
            "unnamed": self.unnamed,
            "exact": self._all_counted(),
            "dropped": {"conns": self._dropped_rows, "names": self._dropped_names},
        }

    def _intern(self, s: str | None) -> int:
        if not s:
            return NONE
        index = self._index.get(s)
        if index is None:
            index = self._index[s] = len(self._strings)
            self._strings.append(s)
        return index

    def _dest(self, name: str) -> _Dest:
        dest = self._dests.get(name)
        if dest is None:
            if len(self._dests) >= self._max_destinations:
                name = OTHER
                dest = self._dests.get(OTHER)
            if dest is None:
                dest = self._dests[name] = _Dest()
        return dest


def dumps(netlog: NetLog) -> str:
    """The file's text: compact, one conn row per line so it greps and diffs well."""
    doc = netlog.to_json()
    parts = []
    for key, value in doc.items():
        if key in ("conns", "summary") and isinstance(value, list) and value:
            rows = ",\n".join(_compact(row) for row in value)
            text = f"[\n{rows}\n]"
        else:
            text = _compact(value)
        parts.append(f"{_compact(key)}:{text}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True)


def write(fd: int, netlog: NetLog) -> None:
    """Write the log through FD, which boxyd opened before the run (hostfile.py): never
    by name, since the payload may have changed what the name means since. Replaces
    whatever the file held; synced. OSError reaches the caller."""
    data = dumps(netlog).encode()
    os.ftruncate(fd, 0)
    view = memoryview(data)
    offset = 0
    while offset < len(data):
        offset += os.pwrite(fd, view[offset:], offset)
    os.fsync(fd)


def destinations_table(netlog: NetLog) -> str:
    """The text printed on stderr after a run with network (ends with a newline);
    empty when the run went nowhere."""
    return outcome.destinations_table(netlog.summary())
