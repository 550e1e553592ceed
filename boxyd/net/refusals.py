"""What a run's network refused, in one line at its end — visible without -v (pure:
policy events in, text out). A refusal the user never hears of looks like a broken
network: `npm view` under --profile node on a host whose registry sits in a reserved
range used to fail after a minute with a generic error while the table said nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@dataclass
class Tally:
    connections: int = 0  # flows refused (TCP or UDP), at SYN time or after
    names: set[str] = field(default_factory=set)  # names the allowlist does not hold
    removed: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> addr -> why

    def add(self, ev: Mapping[str, Any]) -> None:
        if ev.get("verdict") != "deny":
            return
        if ev.get("layer") == "net.dns":
            denied = ev.get("denied") or []
            if denied:  # an allowed name whose answers pointed into a refused range
                name = str(ev.get("name") or "?")
                for addr, why in denied:
                    self.removed.setdefault(name, {})[str(addr)] = str(why)
            elif ev.get("name"):
                self.names.add(str(ev["name"]).lower().rstrip("."))
            return
        if ev.get("proto") in ("tcp", "udp"):
            self.connections += int(ev.get("count") or 1)

    def lines(self) -> list[str]:
        """One summary line when anything was refused, then one per name whose every
        answer was removed, saying which --allow-cidr would open it."""
        parts = []
        if self.connections:
            parts.append(f"{_plural(self.connections, 'connection')} refused")
        if self.names:
            parts.append(f"{_plural(len(self.names), 'name')} not allowed")
        answers = sum(len(a) for a in self.removed.values())
        if answers:
            parts.append(f"{_plural(answers, 'DNS answer')} in a refused range removed")
        if not parts:
            return []
        out = [", ".join(parts) + " (-v or --audit-log for details)"]
        for name, addrs in sorted(self.removed.items()):
            cidrs = " ".join(f"--allow-cidr {a}" for a in sorted(addrs))
            whys = sorted(set(addrs.values()))
            out.append(f"{name} answered with {', '.join(sorted(addrs))} ({'; '.join(whys)}), "
                       f"which boxy refuses; if that is really where it lives: {cidrs}")
        return out
