"""What of the payload's output may reach the user's terminal: a streaming filter
over ECMA-48 output. Pure: bytes in, bytes out, no I/O.

The payload writes to a PTY whose master boxyd relays to the user's terminal, and
a terminal acts on what it is sent: OSC 52 sets the clipboard (paste-jacking), and
a query makes the terminal answer on its input, which the user's shell reads as
typed once the payload has gone (CSI 21 t after setting the title types the title;
DECRQSS echoes a string back). So the filter passes what draws and drops what
reports or reaches beyond the screen:

- passed: text, C0 controls except ENQ, SGR, cursor movement and positioning,
  erase, insert/delete, scrolling and scroll regions, tab stops, charset
  designation, DEC private modes (alternate screen, bracketed paste, cursor
  visibility, mouse and focus reporting: what TUI programs need; a mouse or focus
  report carries only coordinates and a fixed form, nothing the payload chose),
  the title stack (CSI 22/23 t), cursor style, soft reset, kitty keyboard flags,
  xterm key modifier options, OSC 0/1/2 (title set), OSC 8 (hyperlinks) and
  palette sets and resets (OSC 4/5/10–19 without `?`, OSC 104/105/110–119);
- dropped: ENQ (answerback), every query (DA1/2/3, DSR/CPR, DECRQM, DECRQSS,
  XTGETTCAP, XTVERSION, DECREQTPARM, DECID, XTWINOPS reports, colour and font
  queries, kitty keyboard and modifier-key queries, DECRQCRA and the other
  `$`/`*`/`#`/`'` forms), XTWINOPS that move, resize, raise or iconify the window
  (and DECSLPP), DECCOLM, Tek mode, xterm logging, VT52 mode, the keyboard lock
  (KAM) and SRM, media copy (printing), OSC 52 in any form, OSC 50 (font), every
  other OSC, every DCS (DECUDK programs keys!), SOS, PM and APC string, the
  ESC % charset switches (they take the terminal out of UTF-8) and ESC SP forms.

Unknown sequences are dropped: the filter passes what it knows to be harmless
rather than dropping what it knows to be harmful.

Everything emitted is text or a complete, allowed sequence, so the terminal is at
rest (ground state) after each: whatever the input, and wherever a stream is cut
(an `attach` replay starts anywhere), the output cannot start a sequence the
filter did not check. A dropped sequence is dropped whole: its bytes are never
shown as text; an OSC that is allowed but longer than OSC_CAP, or a CSI longer
than CSI_CAP, is dropped too, and what is dropped is never buffered.

8-bit C1 controls: the output is taken as UTF-8, as today's terminals decode it.
A byte in 0x80–0x9f that is not part of a valid UTF-8 character is dropped (a
terminal outside UTF-8 mode would take it as CSI, OSC, DCS ...), and so is a C1
control encoded in UTF-8 (U+0080–U+009F, which VTE and xterm act on). Valid UTF-8
text whose continuation bytes fall in that range is passed untouched; a terminal
left in ISO 8859 mode (not UTF-8: xterm +u8) could read those bytes as C1, which
no filter can prevent without corrupting UTF-8 text.
"""

from __future__ import annotations

import re

CSI_CAP = 256  # bytes of a control sequence; an SGR with 24-bit colours is ~40
OSC_CAP = 4096  # bytes of an allowed OSC (a hyperlink's URI; browsers stop near 2 KiB)

ESC, BEL, CAN, SUB, ENQ, DEL = 0x1B, 0x07, 0x18, 0x1A, 0x05, 0x7F

# a chunk without these passes whole (the fast path)
_SPECIAL = bytes((ENQ, ESC, *range(0x80, 0xA0)))
_C1 = bytes(range(0x80, 0xA0))
_C1_UTF8 = re.compile(rb"\xc2[\x80-\x9f]")
# valid UTF-8 multi-byte characters other than U+0080–U+009F, kept (group 1); a C1
# control in UTF-8 and a lone byte in 0x80–0x9f, removed
_UTF8_FIX = re.compile(
    rb"(\xc2[\xa0-\xbf]|[\xc3-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]"
    rb"|[\xe1-\xec\xee\xef][\x80-\xbf]{2}|\xed[\x80-\x9f][\x80-\xbf]"
    rb"|\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}|\xf4[\x80-\x8f][\x80-\xbf]{2})"
    rb"|\xc2[\x80-\x9f]|[\x80-\x9f]"
)
_STRING_STOP = re.compile(rb"[\x00-\x1f]")  # what may end or abort a string

# --- what passes: CSI -------------------------------------------------------------
# final bytes with no private marker and no intermediate: drawing and moving only
_PLAIN = frozenset(b"@ABCDEFGHIJKLMPSTXZ`abdefgjkmrsu^")
_ANSI_MODES = frozenset({4, 20})  # IRM, LNM (not KAM: locks the keyboard; not SRM)
_TITLE_STACK = frozenset({22, 23})  # XTWINOPS push/pop title; every other Ps reports or moves
# DEC private modes that reach beyond the screen: DECANM (VT52 mode), DECCOLM
# (resizes the window), Tek mode, allow 80/132, xterm's logging to a file
_DEC_MODES_DROPPED = frozenset({2, 3, 38, 40, 46})
_PRIVATE = {
    ord("?"): frozenset(b"hlJKsrW"),  # modes, selective erase, mode save/restore, DECST8C
    ord(">"): frozenset(b"mnpsu"),  # XTMODKEYS, pointer mode, shift-escape, kitty push
    ord("="): frozenset(b"u"),  # kitty keyboard flags (not c: DA3)
    ord("<"): frozenset(b"u"),  # kitty pop
}
_INTERMEDIATE = {b" q", b" @", b" A", b"!p"}  # DECSCUSR, SL, SR, DECSTR

# --- what passes: ESC Fe/Fp/Fs -----------------------------------------------------
_ESC_PLAIN = frozenset(b"6789=>DEHMNOFclmno|}~")  # not Z: DECID answers as DA does
_ESC_CHARSET = frozenset(b"()*+-./")  # G0–G3 designation, any final
_ESC_LINE = frozenset(b"34568")  # ESC # : line size, DECALN

# --- what passes: OSC ------------------------------------------------------------
_OSC_TEXT = frozenset({0, 1, 2, 8})  # titles, hyperlinks
_OSC_COLOURS = frozenset({4, 5, *range(10, 20), 104, 105, *range(110, 120)})

# ASCII text and the commonest sequences that pass (SGR, cursor, erase, DEC modes
# but those dropped), matched in one go: a coloured or redrawn screen costs no
# Python per sequence. Anything else goes the long way, which decides the same.
_ASCII = rb"[\x00-\x04\x06-\x1a\x1c-\x7f]*"
# A mode but 2 3 38 40 46: its leading zeros, then nothing or one number from 1-9 on.
# No alternative starts with 0 (the class once had one: 0* or the class could take a
# 0, and a failing "?0;0;...;2h" retried 2^n splits) and they differ in first digit or
# length, so a digit run's prefix matches one way only and (?:;mode)* stays linear.
# Same language: 0^j then "0" is 0^(j+1), which 0* takes alone. Not an atomic group:
# (?>old mode) keeps the class's "1" of "10" and fails it.
_MODE = rb"0*(?:[145-9]|1\d|2\d|3[0-79]|4[1-57-9]|[5-9]\d|[1-9]\d\d+)?"
_RUN = re.compile(
    rb"%s(?:(?:\x1b\[[0-9:;]{0,%d}[%s]|\x1b\[(?=[0-?]{0,%d}[hl])\?%s(?:;%s)*[hl])%s)*"
    % (
        _ASCII,
        CSI_CAP,
        re.escape(bytes(sorted(_PLAIN - {ord("T")}))),
        CSI_CAP,
        _MODE,
        _MODE,
        _ASCII,
    )
)

# states
_GROUND, _ESCAPE, _CSI, _OSC, _STRING = range(5)


def csi_allowed(body: bytes) -> bool:
    """BODY: a complete control sequence after CSI (parameters, intermediates, final)."""
    final, rest = body[-1], body[:-1]
    marker = rest[0] if rest and rest[0] in _PRIVATE else None
    params = rest[1:] if marker is not None else rest
    inter = params.lstrip(b"0123456789:;")
    params = params[: len(params) - len(inter)]
    if inter:
        return marker is None and inter + bytes([final]) in _INTERMEDIATE
    if marker is not None:
        if final not in _PRIVATE[marker]:
            return False
        return (
            marker != ord("?") or final not in b"hlsr" or not _numbers(params) & _DEC_MODES_DROPPED
        )
    if final not in _PLAIN and final not in b"hlt":
        return False
    numbers = params.split(b";")
    if final in b"hl":
        return _numbers(params) <= _ANSI_MODES
    if final == ord("t"):
        return _number(numbers[0]) in _TITLE_STACK
    if final == ord("T"):  # five parameters: highlight mouse tracking, which waits for an answer
        return len(numbers) == 1
    return True


def _number(param: bytes) -> int:
    return int(param) if param.isdigit() else -1


def _numbers(params: bytes) -> set[int]:
    return {_number(p) for p in params.split(b";")}


def esc_allowed(body: bytes) -> bool:
    """BODY: what follows ESC in a complete escape sequence (intermediates, final)."""
    if len(body) == 1:
        return body[0] in _ESC_PLAIN
    first = body[0]
    if first in _ESC_CHARSET:
        return True
    return first == ord("#") and len(body) == 2 and body[1] in _ESC_LINE


def osc_kind(number: bytes) -> int | None:
    """The OSC number when such an OSC may pass (its text is checked at its end)."""
    if not number.isdigit() or len(number) > 4:
        return None
    n = int(number)
    return n if n in _OSC_TEXT or n in _OSC_COLOURS else None


def osc_allowed(kind: int, text: bytes) -> bool:
    """TEXT: what follows 'Ps;' of an allowed OSC KIND, without its terminator."""
    if kind in _OSC_COLOURS and any(f.startswith(b"?") for f in text.split(b";")):
        return False  # a query: the terminal answers with the colour
    try:
        decoded = text.decode()
    except UnicodeDecodeError:
        return False
    return not any(0x80 <= ord(c) <= 0x9F for c in decoded)


_CSI_BYTES = re.compile(rb"[\x30-\x3f]*[\x20-\x2f]*")  # parameters, then intermediates


def _match(pattern: re.Pattern[bytes], data: bytes, pos: int) -> int:
    """Where PATTERN's match at POS ends (these patterns match the empty string too)."""
    m = pattern.match(data, pos)
    return pos if m is None else m.end()


_CSI_SHAPE = re.compile(rb"[<=>?]?[0-9:;]*[\x20-\x2f]*")  # a marker first, or it is ignored
_STRING_END = re.compile(rb"[\x18\x1a\x1b]")  # CAN, SUB abort a string; ESC \ ends it


def _plain(data: bytes, special: bytes = _SPECIAL) -> bool:
    """No byte of SPECIAL in DATA (ASCII: two memchr; else one translate)."""
    if data.isascii():
        return b"\x1b" not in data and b"\x05" not in data
    return len(data.translate(None, special)) == len(data)


def _incomplete_tail(seg: bytes) -> int:
    """How many bytes at the end of SEG start a UTF-8 character they do not finish."""
    for k in range(1, min(3, len(seg)) + 1):
        b = seg[-k]
        if b & 0xC0 == 0x80:
            continue
        if b >= 0xC0:
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return k if need > k else 0
        return 0
    return 0


class TermFilter:
    """The filter for one output stream: state is kept between chunks (a sequence
    may be split across reads), bounded by CSI_CAP and OSC_CAP."""

    def __init__(self) -> None:
        self._state = _GROUND
        self._seq = bytearray()  # the sequence read so far, without its introducer
        self._drop = False  # the current sequence is dropped whole (no longer buffered)
        self._st = False  # in a string, the last byte was ESC (ST is ESC \)
        self._pending = b""  # the start of a UTF-8 character the last chunk cut
        # where the next ENQ and ESC are in the chunk being read: searched again only
        # once passed, so a chunk of many ENQs is not scanned to its end for each
        self._enq = self._esc = -1

    def feed(self, data: bytes) -> bytes:
        """What of DATA (the next chunk) may reach the terminal now."""
        if (
            self._state == _GROUND
            and not self._pending
            and _plain(data)
            and not _incomplete_tail(data)
        ):
            return data  # the fast path: text and harmless C0 controls only
        self._enq, self._esc = data.find(b"\x05"), data.find(b"\x1b")
        out: list[bytes] = []
        pos, end = 0, len(data)
        while pos < end:
            pos = _STEPS[self._state](self, data, pos, out)
        return b"".join(out)

    def flush(self) -> bytes:
        """The end of the stream: a cut UTF-8 character is let go, an unfinished
        sequence dropped."""
        out = self._text(b"", complete=True) if self._pending else b""
        self._enter(_GROUND)
        return out

    def _enter(self, state: int) -> None:
        self._state, self._drop, self._st = state, False, False
        self._seq.clear()

    def _text(self, seg: bytes, *, complete: bool) -> bytes:
        """Text between sequences; COMPLETE: no more of it follows (a sequence does)."""
        if self._pending:
            seg, self._pending = self._pending + seg, b""
        if not complete and (k := _incomplete_tail(seg)):
            seg, self._pending = seg[:-k], seg[-k:]
        if _plain(seg, _C1):
            return seg  # no byte that is, or could encode, a C1 control
        try:
            seg.decode()
        except UnicodeDecodeError:  # lone bytes in 0x80–0x9f go, valid characters stay
            return _UTF8_FIX.sub(rb"\1", seg)
        return _C1_UTF8.sub(b"", seg) if b"\xc2" in seg else seg

    def _ground(self, data: bytes, pos: int, out: list[bytes]) -> int:
        if not self._pending:
            run = _match(_RUN, data, pos)
            if run > pos:
                out.append(data[pos:run])
                return run
        if 0 <= self._enq < pos:
            self._enq = data.find(b"\x05", pos)
        if 0 <= self._esc < pos:
            self._esc = data.find(b"\x1b", pos)
        stop = min(i for i in (self._esc, self._enq, len(data)) if i >= 0)
        if stop > pos or self._pending:
            out.append(self._text(data[pos:stop], complete=stop < len(data)))
        if stop == len(data):
            return stop
        if data[stop] == ESC:
            self._enter(_ESCAPE)
        return stop + 1  # ENQ: dropped (the terminal would send its answerback)

    def _control(self, b: int, out: list[bytes]) -> bool:
        """A byte below 0x20 or DEL inside a CSI or an escape sequence, which the
        terminal acts on there and then: True when it was handled here."""
        if b == ESC:
            self._enter(_ESCAPE)  # the sequence so far is abandoned
        elif b in (CAN, SUB):
            self._enter(_GROUND)
        elif b < 0x20 and b != ENQ:
            out.append(bytes((b,)))  # executed in place: the same before the sequence
        return b < 0x20 or b == DEL

    def _escape(self, data: bytes, pos: int, out: list[bytes]) -> int:
        b = data[pos]
        if self._control(b, out):
            return pos + 1
        if b >= 0x80:  # not a sequence: abandoned, the byte is text again
            self._enter(_GROUND)
            return pos
        if b < 0x30:  # an intermediate
            if len(self._seq) >= CSI_CAP:
                self._drop = True
            else:
                self._seq.append(b)
            return pos + 1
        if not self._seq and b in b"[]PX^_":
            self._enter({0x5B: _CSI, 0x5D: _OSC}.get(b, _STRING))
            return pos + 1
        body = bytes(self._seq) + bytes((b,))
        if not self._drop and esc_allowed(body):
            out.append(b"\x1b" + body)
        self._enter(_GROUND)
        return pos + 1

    def _csi(self, data: bytes, pos: int, out: list[bytes]) -> int:
        stop = _match(_CSI_BYTES, data, pos)
        if not self._drop:
            if len(self._seq) + stop - pos > CSI_CAP:
                self._drop = True
                self._seq.clear()
            else:
                self._seq += data[pos:stop]
        if stop == len(data):
            return stop
        b = data[stop]
        if self._control(b, out):
            return stop + 1
        if b >= 0x80:
            self._enter(_GROUND)
            return stop
        if b < 0x40:  # a parameter after an intermediate: ignored up to its final byte
            self._drop = True
            return stop + 1
        seq = bytes(self._seq)  # b is a final byte (0x40–0x7e)
        if not self._drop and _CSI_SHAPE.fullmatch(seq) and csi_allowed(seq + bytes((b,))):
            out.append(b"\x1b[" + seq + bytes((b,)))
        self._enter(_GROUND)
        return stop + 1

    def _string_escape(self, data: bytes, pos: int) -> bool:
        """After ESC in a string: True when it was ST; otherwise the string is
        abandoned and the ESC starts a new sequence (its byte is read again)."""
        self._st = False
        if data[pos] == 0x5C:
            return True
        self._enter(_ESCAPE)
        return False

    def _osc(self, data: bytes, pos: int, out: list[bytes]) -> int:
        if self._st:
            if self._string_escape(data, pos):
                self._end_osc(b"\x1b\\", out)
                return pos + 1
            return pos
        m = _STRING_STOP.search(data, pos)
        stop = m.start() if m is not None else len(data)
        if not self._drop:
            if len(self._seq) + stop - pos > OSC_CAP:
                self._drop = True
                self._seq.clear()
            else:
                self._seq += data[pos:stop]
        if m is None:
            return stop
        b = data[stop]
        if b == BEL:
            self._end_osc(b"\x07", out)
        elif b == ESC:
            self._st = True
        elif b in (CAN, SUB):
            self._enter(_GROUND)
        return stop + 1  # any other C0 inside a string is ignored, as terminals do

    def _end_osc(self, terminator: bytes, out: list[bytes]) -> None:
        if not self._drop:
            number, _, text = bytes(self._seq).partition(b";")
            kind = osc_kind(number)
            if kind is not None and osc_allowed(kind, text):
                out.append(b"\x1b]" + bytes(self._seq) + terminator)
        self._enter(_GROUND)

    def _string(self, data: bytes, pos: int, out: list[bytes]) -> int:
        """DCS, SOS, PM, APC: dropped whole, never buffered."""
        if self._st:
            if self._string_escape(data, pos):
                self._enter(_GROUND)
                return pos + 1
            return pos
        m = _STRING_END.search(data, pos)
        if m is None:
            return len(data)
        if data[m.start()] == ESC:
            self._st = True
        else:
            self._enter(_GROUND)
        return m.start() + 1


_STEPS = (
    TermFilter._ground,
    TermFilter._escape,
    TermFilter._csi,
    TermFilter._osc,
    TermFilter._string,
)  # indexed by state


def filter_once(data: bytes) -> bytes:
    """DATA as a whole stream from a fresh state (an `attach` replay, cut anywhere)."""
    f = TermFilter()
    return f.feed(data) + f.flush()


# The filter runs in each session's output thread, in boxyd's process: its Python
# holds the GIL every other session needs. It is linear, but output made of short
# sequences (ESC O, cut UTF-8 between escapes) costs it ~1 µs a byte where text costs
# ~1 ns. So each session's filter has a share of one core; past it the output thread
# waits before its next read, the PTY fills and the payload's writes block: slower
# output, never unfiltered output, and no other session pays for it.
FILTER_SHARE = 0.2  # of one core, for one session's filter
FILTER_BURST = 0.5  # seconds of filtering in hand (a TUI's redraws never wait)


class Pace:
    """One session's budget of filter time (pure: the caller gives the clock)."""

    def __init__(
        self, now: float, share: float = FILTER_SHARE, burst: float = FILTER_BURST
    ) -> None:
        self._share, self._burst = share, burst
        self._credit, self._at = burst, now

    def spent(self, cost: float, now: float) -> float:
        """COST seconds of filtering, ended at NOW: how long to wait before reading on."""
        self._credit = min(self._burst, self._credit + (now - self._at) * self._share) - cost
        self._at = now
        return 0.0 if self._credit >= 0 else -self._credit / self._share
