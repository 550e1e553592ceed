"""Shell completion and boxyctl(1), generated from the parser and installed by
`make setup` (`make docs`): the man page renders, completion offers what the parser
takes."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from boxy.options import RUN_OPTIONS
from boxyctl import completion
from boxyctl.commands.table import SESSION_ID


def _share() -> Path:
    if os.getuid() == 0:
        return Path("/usr/local/share")
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local/share")


def _body(text: str) -> str:
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith(".TH "))  # build id


def test_make_setup_installed_what_the_parser_generates() -> None:
    share = _share()
    assert _body((share / "man/man1/boxyctl.1").read_text()) == _body(completion.man())
    assert (share / "bash-completion/completions/boxyctl").read_text() == completion.bash()
    assert (share / "zsh/site-functions/_boxyctl").read_text() == completion.zsh()
    assert (share / "fish/vendor_completions.d/boxyctl.fish").read_text() == completion.fish()


def test_the_man_page_renders_and_documents_every_run_flag(tmp_path: Path) -> None:
    page = tmp_path / "boxyctl.1"
    page.write_text(completion.man())
    r = subprocess.run(
        ["man", "-l", str(page)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "MANWIDTH": "100", "MAN_KEEP_FORMATTING": "0"},
        timeout=30,
        check=False,
    )
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    text = re.sub(".\x08", "", r.stdout).replace("\u2010", "-")  # overstrike bold, hyphens
    for flag in RUN_OPTIONS:
        for name in flag.names:
            assert name in text, f"{name} is not in boxyctl(1)"
    assert "EXIT STATUS" in text and "124" in text


def _complete(script: Path, *words: str) -> list[str]:
    prog = f"""source {script}
COMP_WORDS=({" ".join(repr(w) if w else '""' for w in words)})
COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMPREPLY=()
_boxyctl; printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    r = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, timeout=30, check=True)
    return [w for w in r.stdout.splitlines() if w]


@pytest.mark.parametrize(
    "words,want",
    [
        (
            ["boxyctl", "run", "--al"],
            [
                "--allow-git-write",
                "--allow-host-config",
                "--allow-host",
                "--allow-port",
                "--allow-cidr",
            ],
        ),
        (["boxyctl", "run", "--net", ""], ["public", "allowlist", "none"]),
        (["boxyctl", "run", "--seccomp", "c"], ["compat"]),
        (["boxy", "da"], ["daemon"]),
        (["boxyctl", "daemon", ""], ["status", "restart", "stop"]),
        (["boxyctl", "profile", "s"], ["show"]),
        (["boxyctl", "completion", ""], ["bash", "zsh", "fish"]),
        (["boxyctl", "run", "--memory", ""], []),  # a value: nothing to offer
        (["boxyctl", "stop", "-"], ["-h", "--help", "-k", "--kill", "--json"]),
    ],
)
def test_bash_completion_offers_what_the_parser_takes(
    tmp_path: Path, words: list[str], want: list[str]
) -> None:
    script = tmp_path / "boxyctl.bash"
    script.write_text(completion.bash())
    assert sorted(_complete(script, *words)) == sorted(want)


def test_bash_completes_paths_for_path_flags(tmp_path: Path) -> None:
    script = tmp_path / "boxyctl.bash"
    script.write_text(completion.bash())
    (tmp_path / "data-dir").mkdir()
    os.chdir(tmp_path)
    assert _complete(script, "boxyctl", "run", "--ro", "data") == ["data-dir"]


def test_fish_and_zsh_cover_every_run_flag() -> None:
    fish, zsh = completion.fish(), completion.zsh()
    for flag in RUN_OPTIONS:
        long = [n for n in flag.names if n.startswith("--")][0]
        assert f"-l {long[2:]}" in fish and long in zsh


def test_bash_completes_profiles_session_ids_and_directories(tmp_path: Path) -> None:
    script = tmp_path / "boxyctl.bash"
    script.write_text(completion.bash())
    fake = tmp_path / "boxyctl"  # `ps -q` as boxyctl prints it (anything else: a refusal)
    fake.write_text("#!/bin/sh\n[ \"$*\" = 'ps -q' ] || exit 2\nprintf '0123abcd\\n4567ef01\\n'\n")
    fake.chmod(0o755)
    (tmp_path / "dir-a").mkdir()
    (tmp_path / "dir-file").write_text("")
    os.chdir(tmp_path)
    assert _complete(script, "boxyctl", "run", "-p", "no") == ["node"]
    assert _complete(script, "boxyctl", "profile", "show", "of") == ["offline"]
    for command in ("show", "attach", "stop", "watch"):
        assert _complete(script, str(fake), command, "0") == ["0123abcd"], command
    assert _complete(script, str(fake), "stop", "-k", "") == ["0123abcd", "4567ef01"]
    assert _complete(script, "boxyctl", "run", "-w", "dir") == ["dir-a"]


def test_the_man_page_has_every_commands_options_and_the_sections(tmp_path: Path) -> None:
    page = tmp_path / "boxyctl.1"
    page.write_text(completion.man())
    r = subprocess.run(
        ["man", "-l", str(page)], capture_output=True, text=True, timeout=30, check=False,
        env={"PATH": "/usr/bin:/bin", "MANWIDTH": "100", "MAN_KEEP_FORMATTING": "0"},
    )  # fmt: skip
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    text = re.sub(".\x08", "", r.stdout).replace("\u2010", "-")
    for section in ("ENVIRONMENT", "FILES", "EXIT STATUS", "EXAMPLES"):
        assert f"\n{section}\n" in text, section
    for flag in ("--kill", "--all", "--force", "--revoke", "--list"):
        assert flag in text, flag
    assert SESSION_ID in text and ".boxy.yaml" in text
