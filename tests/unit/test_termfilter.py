"""termfilter: what of the payload's output reaches the user's terminal. What draws
passes byte for byte; what reports, reaches the clipboard or the window is dropped
whole; the result is the same however the stream is split, and whatever the input,
the output is made only of text and allowed sequences (a fixed point)."""

from __future__ import annotations

import random

import pytest

from boxyd.daemon import termfilter
from boxyd.daemon.termfilter import CSI_CAP, OSC_CAP, TermFilter, filter_once

E = "\x1b"

PASSED: dict[str, str | bytes] = {
    "text": "hello, world\r\n",
    "tab bs bel cr lf": "a\tb\bc\x07d\re\n",
    "utf-8 text": "héllo “quoted” ⛄ 中文 🐍 ‛",
    "sgr reset": f"{E}[m{E}[0m",
    "sgr 16 colours": f"{E}[1;31;42mX{E}[22;39;49m",
    "sgr 256 colours": f"{E}[38;5;208m",
    "sgr truecolour": f"{E}[38;2;255;128;0;48;2;0;0;0m",
    "sgr subparameters": f"{E}[4:3m{E}[58:2::255:0:0m",
    "cursor up/down/fwd/back": f"{E}[A{E}[2B{E}[10C{E}[D",
    "cursor next/prev line, column": f"{E}[E{E}[3F{E}[5G",
    "cursor position": f"{E}[H{E}[12;40H{E}[;5H{E}[3;4f",
    "line, column absolute/relative": f"{E}[5d{E}[7`{E}[2a{E}[2e",
    "erase display/line": f"{E}[J{E}[2J{E}[3J{E}[K{E}[1K{E}[2K",
    "selective erase": f"{E}[?J{E}[?2K",
    "insert/delete lines, chars": f"{E}[2L{E}[M{E}[3@{E}[P{E}[4X",
    "scroll up/down": f"{E}[S{E}[3T",
    "scroll region": f"{E}[r{E}[5;20r",
    "left/right margins, save/restore cursor": f"{E}[s{E}[u{E}[1;80s",
    "tabs": f"{E}[I{E}[2Z{E}[g{E}[3g",
    "repeat": f"x{E}[5b",
    "insert mode, newline mode": f"{E}[4h{E}[4l{E}[20h{E}[20l",
    "alternate screen": f"{E}[?1049h{E}[?1049l{E}[?47h{E}[?1047l",
    "bracketed paste": f"{E}[?2004h{E}[?2004l",
    "cursor visibility, blink": f"{E}[?25l{E}[?25h{E}[?12h",
    "application cursor keys, autowrap, origin": f"{E}[?1h{E}[?7l{E}[?6h",
    "mouse modes": f"{E}[?1000h{E}[?1002h{E}[?1003h{E}[?1006h{E}[?1015h{E}[?9l",
    "focus events, synchronised output": f"{E}[?1004h{E}[?2026h{E}[?2026l",
    "several modes at once": f"{E}[?1049;25;1006h",
    "mode save/restore": f"{E}[?1049s{E}[?1049r",
    "title stack push/pop": f"{E}[22;0t{E}[23;0t{E}[22t{E}[23;2t",
    "cursor style": f"{E}[2 q{E}[ q",
    "soft reset": f"{E}[!p",
    "scroll left/right": f"{E}[2 @{E}[ A",
    "kitty keyboard push/pop/set": f"{E}[>1u{E}[<u{E}[=1;1u",
    "xterm modifyOtherKeys": f"{E}[>4;2m{E}[>4m{E}[>4n",
    "pointer mode, shift escape": f"{E}[>1p{E}[>0s",
    "save/restore cursor (ESC 7/8)": f"{E}7{E}8",
    "keypad modes": f"{E}={E}>",
    "index, next line, tab set, reverse index": f"{E}D{E}E{E}H{E}M",
    "full reset": f"{E}c",
    "charsets": f"{E}(0q{E}(B{E})0{E}*A{E}+B{E}-A{E}.A{E}/A{E}(%5",
    "line drawing shifts": "\x0e\x0f",
    "locking shifts": f"{E}n{E}o{E}|{E}}}{E}~",
    "double width/height, alignment": f"{E}#3{E}#4{E}#5{E}#6{E}#8",
    "title set (BEL)": f"{E}]0;my title\x07",
    "title set (ST)": f"{E}]2;my title{E}\\",
    "icon name set": f"{E}]1;icon\x07",
    "title set in UTF-8": f"{E}]2;“build” ✓ 🐍\x07",
    "empty title": f"{E}]2;\x07",
    "hyperlink": f"{E}]8;;https://example.com/a?b=c{E}\\link{E}]8;;{E}\\",
    "hyperlink with id": f"{E}]8;id=x;https://example.com\x07a{E}]8;;\x07",
    "palette set": f"{E}]4;1;rgb:ff/00/00;2;#00ff00\x07",
    "foreground/background set": f"{E}]10;#ffffff\x07{E}]11;rgb:00/00/00{E}\\",
    "cursor colour set": f"{E}]12;red\x07",
    "palette and colour resets": f"{E}]104\x07{E}]104;1\x07{E}]110\x07{E}]111\x07{E}]112{E}\\",
}

DROPPED: dict[str, str | bytes] = {
    "ENQ (answerback)": "\x05",
    "DA1": f"{E}[c",
    "DA1 with 0": f"{E}[0c",
    "DA2": f"{E}[>c",
    "DA2 with 0": f"{E}[>0c",
    "DA3": f"{E}[=c",
    "DECID": f"{E}Z",
    "DSR status": f"{E}[5n",
    "CPR": f"{E}[6n",
    "DEC CPR": f"{E}[?6n",
    "DEC DSR printer/UDK/keyboard/locator": f"{E}[?15n{E}[?25n{E}[?26n{E}[?53n{E}[?55n",
    "DEC DSR colour scheme": f"{E}[?996n",
    "XTWINOPS report title": f"{E}[21t",
    "XTWINOPS report icon label": f"{E}[20t",
    "XTWINOPS report state, position, sizes": (
        f"{E}[11t{E}[13t{E}[13;2t{E}[14t{E}[14;2t{E}[15t{E}[16t{E}[18t{E}[19t"
    ),
    "XTWINOPS iconify, deiconify": f"{E}[2t{E}[1t",
    "XTWINOPS move": f"{E}[3;0;0t",
    "XTWINOPS resize pixels, chars": f"{E}[4;2000;3000t{E}[8;200;300t",
    "XTWINOPS raise, lower, refresh": f"{E}[5t{E}[6t{E}[7t",
    "XTWINOPS maximise, fullscreen": f"{E}[9;1t{E}[10;1t",
    "DECSLPP (lines per page resizes)": f"{E}[24t{E}[72t",
    "XTWINOPS without parameter": f"{E}[t",
    "title modes": f"{E}[>0;1t{E}[>2T",
    "DECREQTPARM": f"{E}[x{E}[1x",
    "DECRQM ANSI": f"{E}[4$p",
    "DECRQM DEC": f"{E}[?2004$p",
    "XTVERSION": f"{E}[>q{E}[>0q",
    "DECRQSS SGR": f"{E}P$qm{E}\\",
    "DECRQSS DECSTBM (BEL is no terminator)": f"{E}P$qr\x07{E}\\",
    "XTGETTCAP": f"{E}P+q544e{E}\\",
    "XTSETTCAP": f"{E}P+pxterm{E}\\",
    "DECUDK (programs keys)": f"{E}P0;1|17/6c73{E}\\",
    "sixel": f"{E}Pq#0;2;0;0;0#0!10~-{E}\\",
    "tmux passthrough": f"{E}Ptmux;{E}{E}]52;c;eA=={E}{E}\\{E}\\",
    "SOS": f"{E}Xanything{E}\\",
    "PM": f"{E}^privacy{E}\\",
    "APC (kitty graphics)": f"{E}_Ga=q,i=1;AAAA{E}\\",
    "OSC 52 set clipboard (BEL)": f"{E}]52;c;ZWNobyBwd25lZAo=\x07",
    "OSC 52 set clipboard (ST)": f"{E}]52;c;ZWNobyBwd25lZAo={E}\\",
    "OSC 52 primary and others": f"{E}]52;p;eA==\x07{E}]52;;eA==\x07{E}]52;s0c;eA==\x07",
    "OSC 52 query": f"{E}]52;c;?\x07",
    "OSC 52 with leading zero": f"{E}]052;c;eA==\x07",
    "OSC 50 font query": f"{E}]50;?\x07",
    "OSC 50 font set": f"{E}]50;fixed\x07",
    "OSC 4 palette query": f"{E}]4;1;?\x07",
    "OSC 4 mixed set and query": f"{E}]4;1;red;2;?\x07",
    "OSC 10/11/12 queries": f"{E}]10;?\x07{E}]11;?{E}\\{E}]12;?\x07",
    "OSC 10 second field query": f"{E}]10;red;?\x07",
    "OSC 17/19 queries": f"{E}]17;?\x07{E}]19;?\x07",
    "OSC 5 special colour query": f"{E}]5;0;?\x07",
    "OSC 46 log file": f"{E}]46;/tmp/x\x07",
    "OSC 7 cwd": f"{E}]7;file:///etc\x07",
    "OSC 9, 777 notifications": f"{E}]9;hi\x07{E}]777;notify;a;b\x07",
    "OSC 1337 iTerm2": f"{E}]1337;File=name=eA==:AAAA\x07",
    "OSC 133 shell marks": f"{E}]133;A\x07",
    "OSC 3 X property": f"{E}]3;WM_NAME=x\x07",
    "OSC without number": f"{E}];title\x07",
    "title with a C1 control in UTF-8": f"{E}]2;a\u009b6n\x07",
    "title in invalid UTF-8": b"\x1b]2;a\xff\x9b6n\x07",
    "kitty keyboard query": f"{E}[?u",
    "modifier-key query": f"{E}[?4m",
    "XTSMGRAPHICS query": f"{E}[?1;1S{E}[?2;1;0S",
    "DECRQCRA (reads the screen)": f"{E}[1;1;1;1;24;80*y",
    "DECRQPSR, DECRQTSR": f"{E}[1$w{E}[1$u",
    "DECRQLP, locator": f"{E}[1'|{E}[1;1'z{E}[1'{{",
    "XTREPORTSGR, XTPUSHSGR": f"{E}[1;1;1;1#|{E}[#p{E}[#q{E}[#R",
    "DECSCL, DECSCA": f'{E}[62;1"p{E}[1"q',
    "DECSCPP, DECSNLS (resize)": f"{E}[132$|{E}[48*|",
    "rectangle ops": f"{E}[1;1;5;5$z{E}[1;1;5;5;1$v",
    "media copy (print)": f"{E}[0i{E}[5i{E}[?5i",
    "DECLL LEDs": f"{E}[1q",
    "DECTST": f"{E}[4;1y",
    "KAM keyboard lock, SRM": f"{E}[2h{E}[12l",
    "DECCOLM (resizes)": f"{E}[?3h{E}[?3l",
    "one bad mode in a list": f"{E}[?1049;3h",
    "Tek mode, allow 132, logging": f"{E}[?38h{E}[?40h{E}[?46h",
    "VT52 mode": f"{E}[?2l",
    "highlight mouse tracking": f"{E}[1;1;1;1;24T",
    "CPR-shaped answer": f"{E}[12;40R",
    "ESC % (leaves UTF-8 mode)": f"{E}%@{E}%G",
    "ESC SP (8-bit controls, conformance)": f"{E} G{E} F{E} L",
    "ESC # unknown": f"{E}#9",
    "ST alone": f"{E}\\",
    "ESC k (screen title)": f"{E}k",
    "lone 8-bit CSI, OSC, DCS, SOS, PM, APC, ST": b"\x9b\x9d\x90\x98\x9e\x9f\x9c",
    "C1 controls in UTF-8": "\u009b\u009d\u0090\u0085\u009c",
    "CSI with private marker after parameters": f"{E}[1?h",
    "CSI parameter after intermediate": f"{E}[1 2q",
    "CSI cancelled by CAN, SUB": f"{E}[31\x18{E}[32\x1a",
    "OSC cancelled by CAN": f"{E}]0;t\x18",
    "DCS cancelled by SUB": f"{E}P$q\x1a",
}

# (input, output): what is not simply passed or dropped
CHANGED = [
    (b"a\x9b6nb", b"a6nb"),  # a lone 8-bit CSI goes, what follows is text
    (b"\xc2\x9b6n", b"6n"),  # so does a CSI encoded in UTF-8
    (b"\x9d52;c;eA==\x07", b"52;c;eA==\x07"),  # an 8-bit OSC: its text stays harmless text
    (b"\xe2\x80\x9b\xe2\x80\x9c", b"\xe2\x80\x9b\xe2\x80\x9c"),  # ‛“: C1 bytes inside characters
    (b"\xff\x9b\xfe", b"\xff\xfe"),  # invalid UTF-8: only the C1 byte goes
    (b"\xe2\x9b", b"\xe2"),  # an unfinished character cut by the end: its C1 byte goes
    (b"\xe2\x80\x1b[31m", b"\xe2\x1b[31m"),  # one cut by a sequence
    (b"\xed\xa0\x80", b"\xed\xa0"),  # a surrogate is no character: its C1 byte goes
    (b"\x1b[3\n1m", b"\n\x1b[31m"),  # a C0 inside a CSI acts in place, as the terminal does
    (b"\x1b[3\x051m", b"\x1b[31m"),  # ... but not ENQ
    (b"\x1b[3\x7f1m", b"\x1b[31m"),  # DEL is ignored inside
    (b"\x1b\n7", b"\n\x1b7"),
    (b"\x1b[31\x1b[32m", b"\x1b[32m"),  # ESC abandons a sequence and starts one
    (b"\x1b\x1b[32m", b"\x1b[32m"),
    (b"\x1b]0;ti\ntle\x07", b"\x1b]0;title\x07"),  # a C0 inside a string is ignored
    (b"\x1b]0;t\x1b[6n", b""),  # an OSC abandoned by a sequence that is dropped
    (b"\x1b]0;t\x1b[1m", b"\x1b[1m"),  # ... or passed
    (b"\x1bP$q\x1b[1mx", b"\x1b[1mx"),
    (b"\x1b]52;c;eA==\x1b>", b"\x1b>"),  # OSC 52 abandoned by ESC: only what follows
    (b"\x1b[31\xe2\x9c\x93m", b"\xe2\x9c\x93m"),  # a CSI abandoned by non-ASCII
    (b"\x1b\xe2\x9c\x93", b"\xe2\x9c\x93"),
    (b"\x1b]2;a\x9cb\x07", b""),  # a lone 8-bit ST inside an OSC is no terminator here
    (b"\x1b]2;\xe2\x80\x9c\x1b[6n\x07", b"\x07"),  # “ does not end it; the CSI abandons it
]


def _b(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


@pytest.mark.parametrize("name", PASSED)
def test_passed_byte_for_byte(name: str) -> None:
    data = _b(PASSED[name])
    assert filter_once(data) == data
    assert filter_once(b"<" + data + b">") == b"<" + data + b">"


@pytest.mark.parametrize("name", DROPPED)
def test_dropped_whole(name: str) -> None:
    data = _b(DROPPED[name])
    assert filter_once(data) == b""
    assert filter_once(b"<" + data + b">") == b"<>"


@pytest.mark.parametrize("data,expected", CHANGED)
def test_changed(data: bytes, expected: bytes) -> None:
    assert filter_once(data) == expected


def _corpus() -> list[bytes]:
    return (
        [_b(v) for v in PASSED.values()]
        + [_b(v) for v in DROPPED.values()]
        + [d for d, _ in CHANGED]
    )


def _one_shot(data: bytes) -> bytes:
    return filter_once(data)


def _in_two(data: bytes, i: int) -> bytes:
    f = TermFilter()
    return f.feed(data[:i]) + f.feed(data[i:]) + f.flush()


@pytest.mark.parametrize("data", _corpus(), ids=range(len(_corpus())))
def test_every_two_chunk_split_is_the_same(data: bytes) -> None:
    framed = b"ab" + data + b"\xe2\x9c\x93" + data + b"cd"
    whole = _one_shot(framed)
    for i in range(len(framed) + 1):
        assert _in_two(framed, i) == whole, i


def test_byte_by_byte_is_the_same() -> None:
    stream = b"".join(_corpus())
    f = TermFilter()
    got = b"".join(f.feed(stream[i : i + 1]) for i in range(len(stream))) + f.flush()
    assert got == _one_shot(stream)


def _garbage(rng: random.Random, n: int) -> bytes:
    """Random bytes rich in what the filter decides on."""
    alphabet = b"\x1b\x1b\x1b[]P^_X\\\x07\x05\x18\x1a\x9b\x9d\x9c\x90\xc2\xe2\x80\xbf?;:$ 0123456789cnqtmhlus\n"
    return bytes(
        rng.choice(alphabet) if rng.random() < 0.8 else rng.randrange(256) for _ in range(n)
    )


def test_random_streams_split_anywhere_are_the_same() -> None:
    rng = random.Random(7)
    for _ in range(300):
        data = _garbage(rng, rng.randrange(1, 80))
        whole = _one_shot(data)
        cuts = sorted(rng.sample(range(len(data) + 1), min(3, len(data) + 1)))
        f = TermFilter()
        pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        assert b"".join(f.feed(p) for p in pieces) + f.flush() == whole, data


def test_output_is_a_fixed_point() -> None:
    """Whatever the input, the output is only text and allowed sequences: filtering
    it again changes nothing."""
    rng = random.Random(11)
    inputs = _corpus() + [_garbage(rng, rng.randrange(1, 200)) for _ in range(500)]
    for data in inputs:
        out = _one_shot(data)
        assert _one_shot(out) == out, data


def test_a_replay_cut_anywhere_stays_safe() -> None:
    """An attach replays the ring, cut anywhere: filtered again from a fresh state,
    no tail of a sequence becomes one that reports or reaches the clipboard."""
    hostile = b"".join(_b(v) for v in DROPPED.values())
    ring = _one_shot(b"".join(_b(v) for v in PASSED.values()) + hostile)
    for raw in (ring, hostile):  # the ring as kept, and as if it were the raw output
        for i in range(len(raw)):
            replay = _one_shot(raw[i:])
            assert _one_shot(replay) == replay
            for bad in (b"\x1b]52", b"\x1b[6n", b"\x1b[21t", b"\x1bP", b"\x1b[c", b"\x05"):
                assert bad not in replay, (i, bad)


def test_fast_path_returns_the_chunk_itself() -> None:
    data = b"plain text, tabs\tand newlines\n" * 100
    assert TermFilter().feed(data) is data


def test_an_unterminated_osc_is_dropped_and_never_buffered() -> None:
    f = TermFilter()
    out = f.feed(b"before\x1b]52;c;")
    for _ in range(100):
        out += f.feed(b"QUFB" * 4096)
        assert len(f._seq) <= OSC_CAP
    out += f.feed(b"\x07after")
    assert out == b"beforeafter"


def test_an_allowed_osc_longer_than_the_cap_is_dropped_whole() -> None:
    long_uri = b"https://example.com/" + b"a" * OSC_CAP
    assert filter_once(b"x\x1b]8;;" + long_uri + b"\x1b\\y") == b"xy"
    fits = b"\x1b]8;;https://example.com/" + b"a" * (OSC_CAP - 40) + b"\x07"
    assert filter_once(fits) == fits


def test_an_unterminated_dcs_is_dropped_and_never_buffered() -> None:
    f = TermFilter()
    out = f.feed(b"a\x1bP$q")
    for _ in range(50):
        out += f.feed(b"m" * 65536)
        assert len(f._seq) == 0
    assert out + f.feed(b"\x1b\\b") == b"ab"


def test_a_csi_longer_than_the_cap_is_dropped_whole() -> None:
    assert filter_once(b"\x1b[" + b"1;" * CSI_CAP + b"31mX") == b"X"
    fits = b"\x1b[" + b"1;" * (CSI_CAP // 2 - 1) + b"1m"
    assert filter_once(fits) == fits


def test_state_is_kept_between_chunks() -> None:
    f = TermFilter()
    assert f.feed(b"a\x1b") == b"a"
    assert f.feed(b"]52;c;eA") == b""
    assert f.feed(b"==\x1b") == b""
    assert f.feed(b"\\b\x1b[3") == b"b"
    assert f.feed(b"1mc") == b"\x1b[31mc"
    assert f.feed(b"\xe2\x80") == b""  # the start of a character, held
    assert f.feed(b"\x9c.") == b"\xe2\x80\x9c."


# --- the filter's pace: one session's share of a core ---------------------------------


def test_the_pace_lets_a_burst_through_then_keeps_to_its_share() -> None:
    pace = termfilter.Pace(0.0, share=0.2, burst=0.5)
    assert pace.spent(0.4, 0.4) == 0.0  # within the burst
    # 0.1 left, 0.06 earned since, 0.3 spent: 0.14 short, made up at 0.2 s a second
    assert abs(pace.spent(0.3, 0.7) - 0.14 / 0.2) < 1e-9


def test_a_filter_kept_busy_gets_its_share_and_no_more() -> None:
    pace, now, busy = termfilter.Pace(0.0, share=0.2, burst=0.5), 0.0, 0.0
    for _ in range(10_000):  # every chunk costs 10 ms of filtering
        now += 0.01
        busy += 0.01
        now += pace.spent(0.01, now)
    assert abs(busy / now - 0.2) < 0.01


def test_an_idle_filter_earns_no_more_than_its_burst() -> None:
    pace = termfilter.Pace(0.0, share=0.2, burst=0.5)
    assert pace.spent(0.5, 3600.0) == 0.0
    assert pace.spent(0.1, 3600.0) > 0  # an hour idle left no more than the burst
