"""--pcap: the frames on the sandbox's link, including what the ruleset refused."""

from __future__ import annotations

import ipaddress
import struct
from pathlib import Path

import pytest

from tests.conftest import NetBoxy
from tests.harness.topology import Topology


def frames(path: Path) -> list[bytes]:
    data = path.read_bytes()
    magic, major, minor, _, _, snaplen, linktype = struct.unpack_from("=IHHiIII", data)
    assert (magic, major, minor, linktype) == (0xA1B2C3D4, 2, 4, 1)
    out, pos = [], 24
    while pos < len(data):
        _, _, incl, orig = struct.unpack_from("=IIII", data, pos)
        assert incl == orig, "a frame was truncated"
        out.append(data[pos + 16 : pos + 16 + incl])
        pos += 16 + incl
    assert pos == len(data), "a record runs past the end of the file"
    return out


def tcp_syns(frames_: list[bytes]) -> set[tuple[str, int]]:
    out = set()
    for f in frames_:
        if f[12:14] == b"\x08\x00" and f[14 + 9] == 6:  # IPv4, TCP
            ihl = (f[14] & 0x0F) * 4
            tcp = 14 + ihl
            if f[tcp + 13] & 0x12 == 0x02:  # SYN without ACK
                dst = str(ipaddress.IPv4Address(f[14 + 16 : 14 + 20]))
                out.add((dst, struct.unpack_from("!H", f, tcp + 2)[0]))
    return out


def test_capture_holds_the_refused_syn_and_the_dns_query(netboxy: NetBoxy, net: Topology) -> None:
    cap = netboxy.workdir / "run.pcap"
    r = netboxy.run(
        "--net",
        "allowlist",
        "--allow-host",
        "www.boxy.test",
        "--pcap",
        str(cap),
        cmd=[
            "sh",
            "-c",
            "getent hosts www.boxy.test; curl -s --max-time 3 http://192.168.1.10/ || echo refused",
        ],
    )
    assert r.returncode == 0, r.stderr
    assert b"refused" in r.stdout
    got = frames(cap)
    assert ("192.168.1.10", 80) in tcp_syns(got)
    assert any(b"\x03www\x04boxy\x04test\x00" in f for f in got), "no DNS query captured"
    assert cap.stat().st_mode & 0o777 == 0o600
    assert net.recorder_hits("lan") == 0


def test_capture_stops_at_its_limit(netboxy: NetBoxy) -> None:
    cap = netboxy.workdir / "small.pcap"
    r = netboxy.run(
        "--net",
        "public",
        "--pcap",
        str(cap),
        "--pcap-max",
        "1KiB",
        cmd=["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do getent hosts www.boxy.test; done"],
    )
    assert r.returncode == 0, r.stderr
    assert cap.stat().st_size <= 1024
    assert frames(cap), "nothing fitted"
    assert b"stopped at --pcap-max" in r.stderr


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--net", "none", "--pcap", "x.pcap"], b"--pcap"),
        (
            ["--net", "public", "--pcap", "/nonexistent-dir/x.pcap"],
            b"--pcap /nonexistent-dir/x.pcap",
        ),
    ],
)
def test_capture_refused_before_anything_starts(
    netboxy: NetBoxy, flags: list[str], message: bytes
) -> None:
    r = netboxy.run(*flags, cmd=["touch", "ran"])
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and b"Traceback" not in r.stderr
    assert not (netboxy.workdir / "ran").exists()


def tcp_segments(frames_: list[bytes]) -> list[tuple[str, int, str, int, int]]:
    """(src, sport, dst, dport, flags) of every IPv4 TCP segment, in capture order."""
    out = []
    for f in frames_:
        if f[12:14] == b"\x08\x00" and f[14 + 9] == 6:
            tcp = 14 + (f[14] & 0x0F) * 4
            src = str(ipaddress.IPv4Address(f[14 + 12 : 14 + 16]))
            dst = str(ipaddress.IPv4Address(f[14 + 16 : 14 + 20]))
            sport, dport = struct.unpack_from("!HH", f, tcp)
            out.append((src, sport, dst, dport, f[tcp + 13]))
    return out


SYN, RST, ACK = 0x02, 0x04, 0x10


def test_an_unbound_address_is_refused_at_the_syn_and_a_bound_one_connects(
    netboxy: NetBoxy, net: Topology
) -> None:
    from tests.harness.fakenet import plan

    other, www = plan.SERVER_BY_NAME["other"].v4, plan.SERVER_BY_NAME["www"].v4
    cap = netboxy.workdir / "syn.pcap"
    r = netboxy.run(
        "--net",
        "allowlist",
        "--allow-host",
        "www.boxy.test",
        "--pcap",
        str(cap),
        cmd=[
            "sh",
            "-c",
            f"curl -s --max-time 3 http://{other}/ || echo refused $?; "
            "curl -s --max-time 5 -o /dev/null -w 'status %{http_code}\\n' "
            "http://www.boxy.test/",
        ],
    )
    assert r.returncode == 0, r.stderr
    assert b"refused 7" in r.stdout, r.stdout  # curl 7: could not connect (not 56: reset later)
    assert b"status 200" in r.stdout, (r.stdout, r.stderr)
    segs = tcp_segments(frames(cap))
    to_other = [s for s in segs if s[2] == other and s[3] == 80]
    from_other = [s for s in segs if s[0] == other and s[1] == 80]
    assert to_other and all(s[4] == SYN for s in to_other), to_other  # only SYNs went out
    assert from_other and all(s[4] & RST for s in from_other), from_other  # answered by a reset
    assert not any(s[4] & SYN for s in from_other), "the gateway completed a handshake"
    from_www = [s for s in segs if s[0] == www and s[1] == 80]
    assert any(s[4] & (SYN | ACK) == SYN | ACK for s in from_www), segs  # the bound one connects
    assert net.recorder_hits("lan") == 0
