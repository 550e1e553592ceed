"""The git config parser (checked against git itself) and the keys that run commands."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from boxyd.gitguard.gitconfig import Entry, dangerous_keys, is_dangerous, parse

GIT = shutil.which("git")


def _git_env(home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
    }


def git_list(tmp: Path, data: bytes) -> tuple[list[tuple[str, str | None]], bool]:
    """What git itself reads from ``data``: (key, value) pairs and whether it accepted it."""
    assert GIT is not None, "git not found"
    f = tmp / "cfg"
    f.write_bytes(data)
    r = subprocess.run(
        [GIT, "config", "--no-includes", "-l", "-z", "-f", str(f)],
        capture_output=True,
        env=_git_env(tmp),
        cwd=tmp,
        check=False,
    )
    out = []
    for item in r.stdout.split(b"\0")[:-1]:
        key, sep, value = item.partition(b"\n")
        k = key.decode("utf-8", "surrogateescape")
        out.append((k, value.decode("utf-8", "surrogateescape") if sep else None))
    return out, r.returncode == 0


def ours(data: bytes) -> tuple[list[tuple[str, str | None]], bool]:
    p = parse(data)
    return [(e.key, e.value) for e in p.entries], p.complete


TRICKY = [
    b"[core]\n\tfsmonitor = x\n",
    b"[CORE]\n\tFsMonitor = x\n",
    b'[core "x"]\n\tfsmonitor = x\n',
    b'[Remote "Origin"]\n\turl = u\n',
    b"[branch.Main]\n\tremote = o\n",
    b"[core]\n\tbare\n",
    b"[core]\n\tbare # c\n",
    b"[core]\n\tpager = less \\\n -R\n",
    b'[alias]\n\tx = "!sh -c \\"echo hi\\""\n',
    b"[a] b = c ; comment\n",
    b'[a] b = "c ; not comment"\n',
    b"[a]\n b = c\r\n d = e\r\n",
    b"\xef\xbb\xbf[a]\nb=c\n",
    b'[a]\nb = \\t\\n\\b\\\\\\"\n',
    b"[a]\nb = \\x\n",
    b'[a]\nb = "unterminated\n',
    b'[a "sub\\"q\\\\x"]\nb=c\n',
    b'[a "sub"x]\nb=c\n',
    b"[a\n",
    b"[]\nb=c\n",
    b"[a]\n1b = c\n",
    b"[a]\nb-c = d\n",
    b"[a]\nb_c = d\n",
    b"[a]b=c[d]e=f\n",
    b"[a]\nb = c\0d\n",
    b"[a]\nb = x\ty  \t z   \n",
    b"# comment\n; comment\n[a] ; x\nb=c # y\n",
    b"[a.b.c]\nd=e\n",
    b'[a.b "c"]\nd=e\n',
    b'[a   "c"]\nd=e\n',
    b'[a\t"c"]\nd=e\n',
    b'[a ""]\nd=e\n',
    b"[a]\nb\n=c\n",
    b"[a]\nb   =   \n",
    b'[a]\nb = ""\n',
    b'[a]\nb = " spaced " \n',
    b"[a]\nb\t= c\n",
    b"[a]\nb = c\\\n",
    b"[a]\nb = c\\",
    b"[a]\nb = c",
    b"[a]\nb",
    b"[a]\r\nb = c\r\n",
    b"[a]\nb = c\rd\n",
    b"[a]\n\xc3\xa9 = c\n",
    b'[a "\xc3\xa9"]\nb = \xc3\xa9\n',
    b"k = v\n[a]\nb=c\n",
    b"[a]\nb = c\n\n\n[a]\nb = d\n",
    b"[a]\nB.c = d\n",
    b'[a "x\ny"]\nb=c\n',
    b'[a "x',
    b'[a]\nb = "q\\\nr"\n',
    b"[a]\nb = #\n",
    b'[a]\nb = x"y"z\n',
    b"[a] \n\t\t b\t\n",
    b"[a.]\nb=c\n",
    b"[.a]\nb=c\n",
    b"",
    b"\n\n",
    b"[a]\nb = \\\n\\\n\n",
]


@pytest.mark.parametrize("data", TRICKY)
def test_parser_agrees_with_git(tmp_path: Path, data: bytes) -> None:
    assert ours(data) == git_list(tmp_path, data)


def test_parser_agrees_with_git_on_random_input(tmp_path: Path) -> None:
    rng = random.Random(1234)
    alphabet = list(b'[]"\\ \t\n\r=#;.aAbz0-!\x00\xc3') + [ord("\n")] * 3
    templates = [b"[a]\nb = ", b'[s "x"]\n', b"[core]\n\tfsmonitor = "]
    mismatches = []
    for _ in range(300):
        body = bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 30)))
        data = rng.choice(templates) + body
        if ours(data) != git_list(tmp_path, data):
            mismatches.append(data)
    assert mismatches == []


def test_garbage_never_raises() -> None:
    rng = random.Random(99)
    for _ in range(2000):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 80)))
        parsed = parse(data)
        assert isinstance(parsed.complete, bool)


def test_incomplete_keeps_what_came_before() -> None:
    p = parse(b"[core]\n\tfsmonitor = evil\n[oops\n\tpager = x\n")
    assert not p.complete
    assert [e.key for e in p.entries] == ["core.fsmonitor"]
    assert dangerous_keys(p.entries) == ["core.fsmonitor"]


def test_entry_parts() -> None:
    (e,) = parse(b'[Remote "Origin.x"]\n\tURL = u\n').entries
    assert e == Entry("remote", "Origin.x", "url", "u")
    (e,) = parse(b"[branch.Main]\n\tremote\n").entries
    assert e == Entry("branch", "main", "remote", None)  # legacy form: lower-cased


def keys(text: str) -> list[str]:
    p = parse(text.encode())
    assert p.complete, text
    return dangerous_keys(p.entries)


DANGEROUS = [
    ("[core]\n\tfsmonitor = /x/hook\n", ["core.fsmonitor"]),
    ("[CORE]\n\tFSMONITOR = x\n", ["core.fsmonitor"]),
    ("[core]\n\tfsMonitor = x\n", ["core.fsmonitor"]),
    ('[core "x"]\n\tfsmonitor = y\n', ["core.x.fsmonitor"]),  # inert to git; flagged anyway
    ("[core.x]\n\tfsmonitor = y\n", ["core.x.fsmonitor"]),
    ("[core]\n\tfsmonitor\n", ["core.fsmonitor"]),  # bare key: true, starts the daemon
    ("[core]\n\tfsmonitor = true\n", ["core.fsmonitor"]),
    ('[core]\n\tfsmonitor = "./x" ; comment\n', ["core.fsmonitor"]),
    ("[core]\n\tfsmonitor = \\\n  ./hook\n", ["core.fsmonitor"]),
    ("[core]\n\thooksPath = .githooks\n", ["core.hookspath"]),
    ("[core]\n\tpager = less\n", ["core.pager"]),
    ("[core]\n\tpager = \\\n less\n", ["core.pager"]),
    ("[core]\n\tsshCommand = ssh -i k\n", ["core.sshcommand"]),
    ("[core]\n\teditor = vi\n", ["core.editor"]),
    ("[core]\n\taskPass = x\n", ["core.askpass"]),
    ("[core]\n\tgitProxy = x for example.com\n", ["core.gitproxy"]),
    ("[core]\n\talternateRefsCommand = x\n", ["core.alternaterefscommand"]),
    ('[alias]\n\tx = "!sh"\n', ["alias.x"]),
    ("[alias]\n\tx = !sh\n", ["alias.x"]),
    ('[alias]\n\tx = "!"sh\n', ["alias.x"]),
    # a plain alias can carry -c core.pager=…, --exec-path=…, submodule foreach …
    ("[alias]\n\tst = -c core.pager=evil status\n", ["alias.st"]),
    ("[alias]\n\tst = status\n", ["alias.st"]),
    (
        '[filter "lfs"]\n\tclean = x\n\tsmudge = y\n\tprocess = z\n\trequired = true\n',
        ["filter.lfs.clean", "filter.lfs.smudge", "filter.lfs.process"],
    ),
    ("[diff]\n\texternal = x\n", ["diff.external"]),
    ('[diff "pdf"]\n\ttextconv = x\n', ["diff.pdf.textconv"]),
    ('[diff "pdf"]\n\tcommand = x\n', ["diff.pdf.command"]),
    ("[diff]\n\ttool = vimdiff\n\talgorithm = patience\n", []),
    ('[merge "m"]\n\tdriver = x %O %A %B\n\tname = m\n', ["merge.m.driver"]),
    (
        '[mergetool "m"]\n\tcmd = x\n\tpath = y\n\ttrustExitCode = true\n',
        ["mergetool.m.cmd", "mergetool.m.path"],
    ),
    ('[difftool "d"]\n\tcmd = x\n', ["difftool.d.cmd"]),
    ("[include]\n\tpath = other\n", ["include.path"]),
    ('[includeIf "gitdir:/x/"]\n\tpath = other\n', ["includeif.gitdir:/x/.path"]),
    ("[credential]\n\thelper = store\n", ["credential.helper"]),
    ('[credential "https://x"]\n\thelper = y\n\tusername = u\n', ["credential.https://x.helper"]),
    ("[gpg]\n\tprogram = x\n\tformat = ssh\n", ["gpg.program"]),
    (
        '[gpg "ssh"]\n\tprogram = x\n\tdefaultKeyCommand = y\n\tallowedSignersFile = z\n',
        ["gpg.ssh.program", "gpg.ssh.defaultkeycommand"],
    ),
    ("[sequence]\n\teditor = x\n", ["sequence.editor"]),
    ("[pager]\n\tlog = less -S\n", ["pager.log"]),
    ("[pager]\n\tlog = false\n\tbranch\n\tdiff = 1\n\tshow = Off\n", []),
    ("[uploadpack]\n\tpackObjectsHook = x\n", ["uploadpack.packobjectshook"]),
    ("[protocol]\n\tallow = always\n", ["protocol.allow"]),
    ('[protocol "ext"]\n\tallow = user\n', ["protocol.ext.allow"]),
    ('[protocol "file"]\n\tallow = never\n', []),
    ("[protocol]\n\tversion = 2\n", []),
    (
        '[remote "o"]\n\tuploadpack = x\n\treceivepack = y\n',
        ["remote.o.uploadpack", "remote.o.receivepack"],
    ),
    ('[remote "o"]\n\turl = ext::sh -c x\n', ["remote.o.url"]),
    ('[remote "o"]\n\turl = https://example.com/r\n\tfetch = +refs/heads/*:refs/remotes/o/*\n', []),
    ('[url "ext::sh -c x"]\n\tinsteadOf = https://\n', ["url.ext::sh -c x.insteadof"]),
    ('[url "git@example.com:"]\n\tinsteadOf = https://example.com/\n', []),
    ('[submodule "s"]\n\tupdate = !cmd\n', ["submodule.s.update"]),
    ('[submodule "s"]\n\tupdate = rebase\n\tpath = s\n\turl = ../s\n', []),
    (
        "[sendemail]\n\tsmtpServer = /bin/x\n\ttoCmd = y\n\tsmtpUser = u\n",
        ["sendemail.smtpserver", "sendemail.tocmd"],
    ),
    ("[interactive]\n\tdiffFilter = x\n", ["interactive.difffilter"]),
    ("[init]\n\ttemplateDir = x\n", ["init.templatedir"]),
    (
        '[trailer "s"]\n\tcommand = x\n\tcmd = y\n\tkey = S\n',
        ["trailer.s.command", "trailer.s.cmd"],
    ),
    ('[guitool "g"]\n\tcmd = x\n', ["guitool.g.cmd"]),
    ('[browser "b"]\n\tcmd = x\n\tpath = y\n', ["browser.b.cmd", "browser.b.path"]),
    ("[imap]\n\ttunnel = x\n", ["imap.tunnel"]),
    ("[advice]\n\twaitingForEditor = false\n", []),
    ("[core]\n\tfsmonitor = x\n\tfsmonitor = y\n", ["core.fsmonitor"]),
    (
        "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"
        "\tlogallrefupdates = true\n",
        [],
    ),
    (
        '[remote "origin"]\n\turl = https://example.com/x.git\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n'
        '[branch "main"]\n\tremote = origin\n\tmerge = refs/heads/main\n',
        [],
    ),
    ("[core]\n\tfsmonitor = false\n", []),
    ("[core]\n\tfsmonitor = 0\n", []),
    ("[core]\n\tfsmonitor = No\n", []),
    ("[core]\n\tfsmonitor =\n", []),
]


@pytest.mark.parametrize(("text", "expected"), DANGEROUS)
def test_dangerous_keys(text: str, expected: list[str]) -> None:
    assert keys(text) == expected


# --- bounded: memory per byte read, time per byte, and what fuzzing can reach ------------


def test_parse_memory_is_a_small_multiple_of_the_input() -> None:
    """'b\\n' lines cost ~85 bytes kept per byte read (a frozen dataclass with a
    __dict__ per entry); entries are slotted now, and each distinct one kept once."""
    import tracemalloc

    from boxyd.gitguard.discover import CONFIG_MAX

    size = CONFIG_MAX // 8  # tracemalloc slows the parse down a lot; the ratio is the point
    for data in (b"b\n" * (size // 2), b"[a]\n" + b"k = v\n" * (size // 6)):
        tracemalloc.start()
        try:
            parsed = parse(data)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert parsed.complete and len(parsed.entries) > 10_000
        assert peak < 16 * len(data), peak / len(data)


GIT_SEEDS = [
    b'[core]\n\tfsmonitor = ./x\n[remote "o"]\n\turl = ext::sh -c x\n[include]\n\tpath = ../c\n',
    b'[alias]\n\tst = "!sh -c \\"x\\"" ; c\n[a.B]\n\tk\n[s "x\\"y"]\nk = a\\\nb # c\n',
]
GIT_TOKENS = [
    b"[",
    b"]",
    b'"',
    b"\\",
    b"=",
    b";",
    b"#",
    b"\n",
    b"\r\n",
    b"\t",
    b" ",
    b".",
    b"\x00",
    b"\xff",
    b"\xef\xbb\xbf",
    b"core",
    b"hookspath",
    b"a",
    b"-",
]


def test_fuzz_parse_never_raises() -> None:
    from tests.unit.parserfuzz import mutations

    for data in mutations(GIT_SEEDS, GIT_TOKENS, seed=5):
        parsed = parse(data)
        assert isinstance(parsed.complete, bool)
        for e in parsed.entries:
            assert isinstance(e.key, str) and (e.value is None or isinstance(e.value, str))
            is_dangerous(e)


def test_parse_size_sweep_is_linear() -> None:
    from tests.unit.parserfuzz import assert_linear

    assert_linear(lambda n: b"b\n" * n, parse, 2000)
    assert_linear(lambda n: b"[a]\nk = " + b" x" * n + b"\n", parse, 2000)
    assert_linear(lambda n: b'[s "' + b"\\x" * n + b'"]\n', parse, 2000)
    assert_linear(lambda n: b"k = " + b"\\\n" * n + b"v\n", parse, 2000)
