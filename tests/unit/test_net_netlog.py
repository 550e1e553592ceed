"""boxyd.net.netlog: the --net-log file and the destinations table."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from boxy.outcome import Counters, Destination
from boxyd.net.netlog import CONN_FIELDS, NetLog, destinations_table, dumps, write
from boxyd.plan.hostfile import open_output


def decoded(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Conn rows as dicts with the string indexes resolved (None for -1)."""
    strings = doc["strings"]
    out = []
    for row in doc["conns"]:
        assert len(row) == len(doc["conn_fields"])
        d = dict(zip(doc["conn_fields"], row, strict=True))
        for key in ("addr", "host", "sni", "reason"):
            d[key] = None if d[key] == -1 else strings[d[key]]
        out.append(d)
    return out


def doc_of(log: NetLog) -> dict[str, Any]:
    """LOG.to_json(): JSON values, read as such."""
    return log.to_json()


def sample() -> NetLog:
    log = NetLog()
    log.resolution("registry.example", ["104.16.0.35", "104.16.1.35"])
    a = log.conn(118, "tcp", "allow", "104.16.0.35", 443, "registry.example", "registry.example")
    log.update(a, 1000, 20_000)
    log.update(a, 1400, 2_200_000, final=True)
    b = log.conn(300, "tcp", "allow", "104.16.1.35", 443, "registry.example", "registry.example")
    log.update(b, 600, 100, final=True)
    log.conn(8002, "tcp", "deny", "169.254.169.254", 80, reason="link-local / cloud metadata")
    return log


def test_header_and_field_list() -> None:
    doc = doc_of(NetLog())
    assert doc["version"] == 1
    assert doc["conn_fields"] == [
        "t_ms", "proto", "verdict", "addr", "port", "host", "sni", "reason", "up", "down",
    ]  # fmt: skip
    assert doc["conns"] == [] and doc["strings"] == [] and doc["summary"] == []
    assert doc["dropped"] == {"conns": 0, "names": 0}


def test_rows_have_the_declared_shape_and_minus_one_for_missing() -> None:
    doc = doc_of(sample())
    rows = decoded(doc)
    assert rows == [
        {"t_ms": 118, "proto": "tcp", "verdict": "allow", "addr": "104.16.0.35", "port": 443,
         "host": "registry.example", "sni": "registry.example", "reason": None,
         "up": 1400, "down": 2_200_000},
        {"t_ms": 300, "proto": "tcp", "verdict": "allow", "addr": "104.16.1.35", "port": 443,
         "host": "registry.example", "sni": "registry.example", "reason": None,
         "up": 600, "down": 100},
        {"t_ms": 8002, "proto": "tcp", "verdict": "deny", "addr": "169.254.169.254", "port": 80,
         "host": None, "sni": None, "reason": "link-local / cloud metadata", "up": 0, "down": 0},
    ]  # fmt: skip
    assert doc["conns"][2][CONN_FIELDS.index("host")] == -1
    assert doc["conns"][2][CONN_FIELDS.index("sni")] == -1


def test_strings_are_interned_once() -> None:
    log = NetLog()
    for i in range(50):
        log.conn(i, "tcp", "allow", "192.0.2.7", 443, "a.example", "a.example")
    log.conn(60, "udp", "deny", "192.0.2.7", 53, reason="a.example")
    doc = doc_of(log)
    assert doc["strings"] == ["192.0.2.7", "a.example"]
    assert {tuple(r[3:8]) for r in doc["conns"][:50]} == {(0, 443, 1, 1, -1)}
    assert doc["conns"][50][7] == 1
    assert len(json.dumps(doc)) < 50 * 60  # small, because nothing is repeated


def test_empty_strings_count_as_missing() -> None:
    log = NetLog()
    log.conn(0, "tcp", "deny", "192.0.2.1", 1, host="", sni="", reason="")
    assert doc_of(log)["conns"][0][5:8] == [-1, -1, -1]


def test_resolutions_union_in_order_and_bounded() -> None:
    log = NetLog(max_addrs_per_name=3, max_names=2)
    log.resolution("a.example", ["192.0.2.1", "192.0.2.2"])
    log.resolution("a.example", ["192.0.2.2", "192.0.2.3", "192.0.2.4"])
    log.resolution("b.example", [])
    log.resolution("c.example", ["192.0.2.9"])  # over the name bound
    log.resolution("a.example", ["192.0.2.5"])  # over the per-name bound
    doc = doc_of(log)
    assert doc["resolutions"] == {
        "a.example": ["192.0.2.1", "192.0.2.2", "192.0.2.3"],
        "b.example": [],
    }
    assert doc["dropped"]["names"] == 1


def test_summary_numbers() -> None:
    log = sample()
    # A client claiming a trusted name to an unbound address is filed under the address.
    c = log.conn(9000, "tcp", "allow", "198.51.100.9", 443, sni="registry.example")
    log.update(c, 5, 7, final=True)
    log.conn(9100, "tcp", "error", "104.16.0.35", 443, "registry.example", reason="refused")
    assert log.summary() == [
        Destination(
            "registry.example",
            connections=3,
            denied=0,
            addresses=2,
            bytes_up=2000,
            bytes_down=2_200_100,
        ),
        Destination(
            "169.254.169.254", connections=1, denied=1, addresses=1, bytes_up=0, bytes_down=0
        ),
        Destination("198.51.100.9", connections=1, denied=0, addresses=1, bytes_up=5, bytes_down=7),
    ]
    doc = doc_of(log)
    assert doc["summary_fields"] == ["destination", "conns", "denied", "addrs", "sent", "received"]
    assert doc["summary"][0] == ["registry.example", 3, 0, 2, 2000, 2_200_100]


def test_summary_sorted_by_conns_then_name() -> None:
    log = NetLog()
    for name, n in (("b.example", 2), ("c.example", 5), ("a.example", 2)):
        for _ in range(n):
            log.conn(0, "tcp", "deny", "192.0.2.1", 443, name)
    assert [d.name for d in log.summary()] == ["c.example", "a.example", "b.example"]


def test_updates_are_totals_and_only_grow() -> None:
    log = NetLog()
    h = log.conn(0, "tcp", "allow", "192.0.2.1", 443, "a.example")
    log.update(h, 10, 20)
    log.update(h, 10, 20)
    log.update(h, 15, 20)
    assert log.summary()[0].bytes_up == 15 and log.summary()[0].bytes_down == 20
    with pytest.raises(ValueError, match="went down"):
        log.update(h, 14, 20)
    log.update(h, 15, 30, final=True)
    with pytest.raises(KeyError):
        log.update(h, 16, 30)
    assert doc_of(log)["conns"][0][-2:] == [15, 30]


def test_only_allowed_conns_take_updates() -> None:
    log = NetLog()
    denied = log.conn(0, "tcp", "deny", "192.0.2.1", 443)
    failed = log.conn(0, "tcp", "error", "192.0.2.1", 443, reason="timed out")
    for h in (denied, failed, 99):
        with pytest.raises(KeyError):
            log.update(h, 1, 1)


@pytest.mark.parametrize(
    "args,match",
    [
        ((0, "icmp", "allow", "192.0.2.1", 1), "protocol"),
        ((0, "tcp", "maybe", "192.0.2.1", 1), "verdict"),
        ((0, "tcp", "allow", "192.0.2.1", 65536), "port"),
        ((0, "tcp", "allow", "192.0.2.1", -1), "port"),
    ],
)
def test_bad_conn_arguments(args: tuple[int, str, str, str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        NetLog().conn(*args)


def test_row_bound_keeps_counting() -> None:
    log = NetLog(max_rows=3)
    handles = [log.conn(i, "tcp", "allow", f"192.0.2.{i}", 443, "a.example") for i in range(5)]
    log.conn(9, "tcp", "deny", "192.0.2.99", 443, "a.example")
    for h in handles:
        log.update(h, 100, 1000, final=True)
    doc = doc_of(log)
    assert len(doc["conns"]) == 3
    assert doc["dropped"]["conns"] == 3 and log.dropped() == (3, 0)
    assert "192.0.2.4" not in doc["strings"]  # dropped rows intern nothing
    assert log.summary() == [Destination("a.example", 6, 1, 6, 500, 5000)]
    with pytest.raises(KeyError):  # dropped rows release their state at final too
        log.update(handles[4], 101, 1000)


def test_destination_bound_folds_into_other() -> None:
    log = NetLog(max_destinations=2)
    for i in range(5):
        h = log.conn(i, "tcp", "allow", f"192.0.2.{i}", 443)
        log.update(h, 1, 2, final=True)
    log.conn(9, "tcp", "deny", "192.0.2.0", 443)  # an existing destination stays its own
    assert log.summary() == [
        Destination("(other)", 3, 0, 3, 3, 6),
        Destination("192.0.2.0", 2, 1, 1, 1, 2),
        Destination("192.0.2.1", 1, 0, 1, 1, 2),
    ]


def test_to_json_is_a_snapshot() -> None:
    log = NetLog()
    h = log.conn(0, "tcp", "allow", "192.0.2.1", 443)
    before = doc_of(log)
    log.update(h, 5, 5)
    log.resolution("a.example", ["192.0.2.1"])
    assert before["conns"][0][-2:] == [0, 0]
    assert before["resolutions"] == {}


def test_dumps_round_trips_one_row_per_line() -> None:
    log = sample()
    text = dumps(log)
    assert json.loads(text) == log.to_json()
    conn_lines = [line for line in text.splitlines() if line.startswith("[") and '"tcp"' in line]
    assert len(conn_lines) == 3
    assert json.loads(dumps(NetLog())) == NetLog().to_json()


# --- the table ------------------------------------------------------------------------


def test_destinations_table_exact_text() -> None:
    log = NetLog()
    for i in range(14):
        h = log.conn(i, "tcp", "allow", f"104.16.{i % 3}.35", 443, "registry.example")
        log.update(
            h, 39_322 // 14 + (i < 39_322 % 14), 6_396_314 // 14 + (i < 6_396_314 % 14), final=True
        )
    log.conn(99, "tcp", "deny", "169.254.169.254", 80, reason="link-local / cloud metadata")
    assert destinations_table(log) == (
        "network destinations (2)\n"
        "  DESTINATION       CONNS  DENIED  ADDRS  SENT     RECEIVED\n"
        "  registry.example  14     0       3      38.4KiB  6.1MiB\n"
        "  169.254.169.254   1      1       1      0B       0B\n"
    )


def test_destinations_table_columns_follow_content() -> None:
    log = NetLog()
    h = log.conn(0, "tcp", "allow", "2001:db8:ffff:ffff:ffff:ffff:ffff:1", 443)
    log.update(h, 3 << 30, 1023, final=True)
    lines = destinations_table(log).splitlines()
    assert (
        lines[1] == "  DESTINATION                          CONNS  DENIED  ADDRS  SENT    RECEIVED"
    )
    assert lines[2] == "  2001:db8:ffff:ffff:ffff:ffff:ffff:1  1      0       1      3.0GiB  1023B"


def test_destinations_table_empty() -> None:
    assert destinations_table(NetLog()) == ""  # a run that went nowhere says nothing


# --- writing --------------------------------------------------------------------------


def test_write_replaces_what_the_file_held(tmp_path: Path) -> None:
    path = tmp_path / "net.json"
    path.write_text("a much longer previous run " * 1000)
    fd = open_output("--net-log", str(path), [], truncate=False)
    try:
        write(fd, sample())
    finally:
        os.close(fd)
    assert json.loads(path.read_text()) == sample().to_json()
    assert os.listdir(tmp_path) == ["net.json"]


def test_write_goes_through_the_descriptor_never_the_name(tmp_path: Path) -> None:
    """What the payload does to the name after the open changes nothing boxyd writes."""
    path = tmp_path / "net.json"
    fd = open_output("--net-log", str(path), [], truncate=False)
    try:
        os.rename(path, tmp_path / "moved")
        victim = tmp_path / "victim"
        victim.write_text("keep\n")
        path.symlink_to(victim)
        write(fd, sample())
    finally:
        os.close(fd)
    assert victim.read_text() == "keep\n"
    assert json.loads((tmp_path / "moved").read_text())["version"] == 1


def test_removed_answers_make_their_name_a_name_denied_not_a_destination() -> None:
    log = NetLog()
    log.removed("Registry.example.", 2)
    log.refused_name("registry.example")
    assert log.summary() == [] and destinations_table(log) == ""
    assert log.to_json()["names_denied"] == {"registry.example": 3}
    assert log.totals() == Counters(names_denied=1)


def test_names_and_connections_are_counted_apart() -> None:
    log = NetLog()
    log.conn(1, "tcp", "allow", "203.0.113.1", 443, host="a.example")
    log.conn(2, "tcp", "deny", "169.254.169.254", 80, reason="link-local")
    for _ in range(45):
        log.refused_name("c2.example")
    c = log.totals()
    assert (c.connections, c.denials, c.names_denied, c.destinations) == (2, 1, 1, 2)


def test_refusals_nothing_named_count_in_the_totals_in_no_row() -> None:
    """A SYN flood past NFLOG's rate: the gateway sets ``unnamed`` from the ruleset's
    counter; the totals are exact, the table has only what was named."""
    log = NetLog()
    log.conn(1, "tcp", "deny", "192.0.2.9", 443, reason="no DNS binding")
    log.unnamed = 704_990
    c = log.totals()
    assert (c.connections, c.denials, c.destinations, c.exact) == (704_991, 704_991, 1, True)
    assert [(d.name, d.connections, d.denied) for d in log.summary()] == [("192.0.2.9", 1, 1)]
    assert log.to_json()["unnamed"] == 704_990 and log.to_json()["exact"] is True


def test_a_count_that_could_not_be_read_makes_every_total_a_lower_bound() -> None:
    log = NetLog(max_names=1)
    log.refused_name("a.example")
    assert log.totals().exact
    log.refused_name("b.example")  # past max_names: counted, not named
    assert not log.totals().exact and log.totals().names_denied == 1
    other = NetLog()
    other.exact = False
    assert not other.totals().exact and other.to_json()["exact"] is False
