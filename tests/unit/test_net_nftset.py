"""boxyd.net.nftset: the set-element messages boxyd sends the gateway netns (pure part)."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from boxyd.net import netlink, nftset
from boxyd.net.netlink import attrs

V4, V6 = ipaddress.ip_address("11.0.0.60"), ipaddress.ip_address("2a0b:4000::60")


def nested(data: bytes) -> list[tuple[int, bytes]]:
    """Every attribute in order, type with its flags (attrs() keeps only the last)."""
    out, pos = [], 0
    while pos + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, pos)
        out.append((kind, data[pos + 4 : pos + length]))
        pos += (length + 3) & ~3
    return out


def test_element_is_a_nested_key_and_a_big_endian_millisecond_timeout() -> None:
    ((kind, body),) = nested(nftset.element(V4, 61_500))
    assert kind == nftset.NFTA_LIST_ELEM | nftset.NLA_F_NESTED
    (key_kind, key), (t_kind, timeout) = nested(body)
    assert key_kind == nftset.NFTA_SET_ELEM_KEY | nftset.NLA_F_NESTED
    assert nested(key) == [(nftset.NFTA_DATA_VALUE, V4.packed)]
    assert (t_kind, timeout) == (nftset.NFTA_SET_ELEM_TIMEOUT, (61_500).to_bytes(8, "big"))


def test_element_without_timeout_never_expires_and_v6_keys_are_16_bytes() -> None:
    ((_, body),) = nested(nftset.element(V6, None))
    ((_, key),) = nested(body)
    assert nested(key) == [(nftset.NFTA_DATA_VALUE, V6.packed)] and len(V6.packed) == 16


@pytest.mark.parametrize("bad", [0, -1, 2**63, True])
def test_element_timeout_out_of_range(bad: int) -> None:
    with pytest.raises(ValueError, match="timeout"):
        nftset.element(V4, bad)


def test_newsetelem_message() -> None:
    msg = nftset.setelem_message(
        nftset.NFT_MSG_NEWSETELEM,
        "boxy",
        "bound4",
        [nftset.element(V4, 1000), nftset.element(V4, 2000)],
        7,
    )
    ((kind, seq, payload),) = list(netlink.messages(msg))
    assert kind == (10 << 8) | 12 and seq == 7
    flags = struct.unpack_from("=H", msg, 6)[0]
    assert flags == netlink.NLM_F_REQUEST | netlink.NLM_F_ACK | nftset.NLM_F_CREATE
    assert payload[:4] == bytes([1, 0, 0, 0])  # NFPROTO_INET, NFNETLINK_V0, res_id 0
    a = attrs(payload[4:])
    assert a[nftset.NFTA_SET_ELEM_LIST_TABLE] == b"boxy\0"
    assert a[nftset.NFTA_SET_ELEM_LIST_SET] == b"bound4\0"
    elems = nested(a[nftset.NFTA_SET_ELEM_LIST_ELEMENTS])
    assert len(elems) == 2
    kinds = [k for k, _ in nested(payload[4:])]
    assert kinds == [1, 2, 3 | nftset.NLA_F_NESTED]


def test_a_message_needs_an_element() -> None:
    with pytest.raises(ValueError, match="at least one element"):
        nftset.setelem_message(nftset.NFT_MSG_NEWSETELEM, "boxy", "bound4", [], 1)


def test_batch_wraps_messages_in_begin_and_end() -> None:
    one = nftset.setelem_message(
        nftset.NFT_MSG_NEWSETELEM, "boxy", "bound4", [nftset.element(V4, 1000)], 11
    )
    two = nftset.setelem_message(
        nftset.NFT_MSG_NEWSETELEM, "boxy", "bound6", [nftset.element(V6, 1000)], 12
    )
    got = list(netlink.messages(nftset.batch([one, two], 10)))
    assert [(k, s) for k, s, _ in got] == [(0x10, 10), (0x0A0C, 11), (0x0A0C, 12), (0x11, 13)]
    # begin/end: AF_UNSPEC, version 0, res_id = the nftables subsystem, network order
    assert got[0][2] == got[3][2] == bytes([0, 0, 0, 10])


def test_acks_read_errors_and_successes_by_sequence() -> None:
    def ack(seq: int, err: int) -> bytes:
        return netlink.message(netlink.NLMSG_ERROR, 0, seq, struct.pack("=i", -err) + b"\0" * 16)

    assert nftset.acks(ack(5, 0) + ack(6, 2)) == {5: 0, 6: 2}
    assert nftset.acks(ack(5, 0) + b"\xff\x00\x00\x00garbage") == {5: 0}  # stops, keeps
    assert nftset.acks(b"") == {}
