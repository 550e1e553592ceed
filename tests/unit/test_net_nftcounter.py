"""The ruleset's refusal counter as boxyd asks for it and reads the answer (the
encoding; tests/integration/test_netns.py reads a real kernel's)."""

from __future__ import annotations

import errno
import struct

import pytest

from boxyd.net import netlink, nftcounter
from boxyd.net.netlink import NLMSG_ERROR, attr, attrs
from boxyd.net.nftset import NFNL_SUBSYS_NFTABLES, NFPROTO_INET, nfgen

NEWOBJ = (NFNL_SUBSYS_NFTABLES << 8) | nftcounter.NFT_MSG_NEWOBJ


def answer(seq: int, packets: int) -> bytes:
    data = attr(nftcounter.NFTA_COUNTER_PACKETS, struct.pack("!Q", packets))
    body = nfgen(NFPROTO_INET) + attr(nftcounter.NFTA_OBJ_NAME, b"refused\0")
    body += attr(nftcounter.NFTA_OBJ_DATA | 0x8000, data)
    return netlink.message(NEWOBJ, 0, seq, body)


def test_the_request_names_table_counter_and_type() -> None:
    ((kind, seq, payload),) = list(netlink.messages(nftcounter.request("boxy", "refused", 7)))
    assert (kind, seq) == ((NFNL_SUBSYS_NFTABLES << 8) | nftcounter.NFT_MSG_GETOBJ, 7)
    assert payload[:4] == nfgen(NFPROTO_INET)
    got = attrs(payload[4:])
    assert got[nftcounter.NFTA_OBJ_TABLE] == b"boxy\0"
    assert got[nftcounter.NFTA_OBJ_NAME] == b"refused\0"
    assert got[nftcounter.NFTA_OBJ_TYPE] == struct.pack("!I", nftcounter.NFT_OBJECT_COUNTER)


def test_the_answer_to_our_request_is_read_and_anothers_is_not() -> None:
    assert nftcounter.reply(answer(5, 711_989), 5) == 711_989
    assert nftcounter.reply(answer(4, 3), 5) is None  # nftset's ack, or a late one
    assert nftcounter.reply(answer(4, 3) + answer(5, 9), 5) == 9
    assert nftcounter.reply(b"\x01\x02", 5) is None


def test_a_refusal_by_the_kernel_raises_with_its_errno() -> None:
    err = netlink.message(NLMSG_ERROR, 0, 5, struct.pack("=i", -errno.ENOENT) + b"\0" * 16)
    with pytest.raises(OSError) as e:
        nftcounter.reply(err, 5)
    assert e.value.errno == errno.ENOENT


def test_an_answer_without_a_count_is_not_taken_for_zero() -> None:
    body = nfgen(NFPROTO_INET) + attr(nftcounter.NFTA_OBJ_NAME, b"refused\0")
    with pytest.raises(ValueError):
        nftcounter.reply(netlink.message(NEWOBJ, 0, 5, body), 5)
