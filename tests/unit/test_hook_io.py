"""boxyctl.hook: the hook's JSON in and out, hook.yaml, and Claude Code's settings
file (boxyd is replaced: daemon_problem is the seam)."""

from __future__ import annotations

import io
import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest

from boxy.errors import UsageError
from boxyctl import hook
from boxyctl import hookpolicy as hp
from boxyctl import main as boxyctl_main


def event(command: str, cwd: str = "/tmp", **extra: Any) -> bytes:
    doc = {
        "session_id": "abc",
        "transcript_path": "/tmp/t.jsonl",
        "cwd": cwd,
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": command, "description": "d", "timeout": 5000},
        **extra,
    }
    return json.dumps(doc).encode()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setattr(hook, "daemon_problem", lambda: None)
    return tmp_path


def run_main(argv: list[str], stdin: bytes, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    return boxyctl_main.main(argv)


def test_allow_with_the_rewritten_command(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run_main(["hook", "claude"], event("npm ci && echo ok"), monkeypatch) == 0
    out = json.loads(capsys.readouterr().out)["hookSpecificOutput"]
    assert out["hookEventName"] == "PreToolUse"
    assert out["permissionDecision"] == "allow"
    assert "npm" in out["permissionDecisionReason"]
    new = out["updatedInput"]
    assert new["description"] == "d" and new["timeout"] == 5000  # the rest kept
    argv = shlex.split(new["command"])
    assert argv[1:4] == ["run", "-p", "node"]
    assert argv[-3:] == ["sh", "-c", "npm ci && echo ok"]


@pytest.mark.parametrize(
    "line,said",
    [
        ("boxyctl allow 9f3 api.example", "boxyctl allow"),
        ("cd /p && FOO=1 /usr/local/bin/boxy trust", "/usr/local/bin/boxy trust"),
        ("npm test; boxyctl allow 9f3 '*.example.com'", "boxyctl allow"),
        # wrappers, a shell's line, a substitution, find's -exec, a run-time subcommand,
        # xargs giving the arguments (bash's grammar, the hook's own _WRAPPERS)
        ("env boxyctl allow 9f3 a.example", "boxyctl allow"),
        ("timeout 5 nice -n 1 boxyctl allow 9f3 a.example", "boxyctl allow"),
        ("bash -c 'boxyctl trust'", "boxyctl trust"),
        ("X=$(boxyctl allow 9f3 a.example)", "boxyctl allow"),
        ("find . -maxdepth 0 -exec boxyctl allow 9f3 a.example \\;", "boxyctl allow"),
        ('boxyctl "$SUB" 9f3 a.example', "boxyctl $SUB"),
        ("echo allow 9f3 a.example | xargs boxyctl", "boxyctl"),
    ],
)
def test_a_line_that_widens_a_sandbox_is_the_users_to_answer(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    line: str, said: str,
) -> None:  # fmt: skip
    """The agent cannot widen its own sandboxes on its own word (issue 34): `boxyctl
    allow` and `trust` get an ask, whatever the harness's own rules would do."""
    assert run_main(["hook", "claude"], event(line), monkeypatch) == 0
    out = json.loads(capsys.readouterr().out)["hookSpecificOutput"]
    assert out["permissionDecision"] == "ask", out
    assert f"`{said}` widens what a sandbox may reach" in out["permissionDecisionReason"], out


@pytest.mark.parametrize(
    "line", ["boxyctl deny 9f3 api.example", "boxyctl show 9f3", "npm i allow", "boxyctl ps"]
)
def test_lines_that_widen_nothing_are_not_asked_about(line: str) -> None:
    assert hp.widens(line) is None


@pytest.mark.parametrize(
    "data",
    [event("ls -la"), event("npm i", tool_name="Read"), event("make", tool_name="Edit")],
)
def test_no_decision(home: Path, capsys: pytest.CaptureFixture[str], data: bytes) -> None:
    assert hook.claude(data) == 0
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"{", "not JSON"),
        (b"[]", "not a JSON object"),
        (b"\xff", "not JSON"),
        (json.dumps({"tool_name": "Bash", "cwd": "/"}).encode(), "hook_event_name"),
        (event("x", hook_event_name="PostToolUse"), "not a PreToolUse"),
        (event("x", tool_input={"description": "no command"}), "tool_input.command"),
        (event("x", tool_input="npm i"), "tool_input.command"),
        (event("x", cwd="relative"), "absolute"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    home: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    data: bytes,
    says: str,
) -> None:
    assert run_main(["hook", "claude"], data, monkeypatch) == 2
    cap = capfd.readouterr()
    assert cap.out == ""
    assert cap.err.count("\n") == 1 and says in cap.err and "Traceback" not in cap.err


def test_a_cwd_that_is_not_there_blocks_the_command(
    home: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail closed: no project to judge (was: allow, with the command rewritten)."""
    gone = str(home / "gone")
    for command in ("npm i", "ls"):  # intercepted or not: the event is not one to answer
        assert run_main(["hook", "claude"], event(command, cwd=gone), monkeypatch) == 2
        cap = capfd.readouterr()
        assert cap.out == ""
        assert cap.err == (
            f"boxyctl: hook claude: the event's cwd {gone}: no such directory; "
            "the command was blocked\n"
        )


def test_on_a_terminal_the_hook_says_what_it_reads(
    home: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Typed by hand it would wait for JSON in silence: one line, exit 2."""
    primary, secondary = os.openpty()
    saved = os.dup(0)
    try:
        os.dup2(secondary, 0)
        assert boxyctl_main.main(["hook", "claude"]) == 2
    finally:
        os.dup2(saved, 0)
        for fd in (saved, primary, secondary):
            os.close(fd)
    cap = capfd.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1
    assert "reads Claude Code's PreToolUse event (JSON) on stdin" in cap.err
    assert "stdin is a terminal" in cap.err


def test_a_bug_in_the_hook_blocks_the_command(
    home: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claude Code runs the command unchanged after any exit but 2: a bug blocks it."""

    def broken(*_: object, **__: object) -> None:
        raise RecursionError("a line deeper than the rule reads")

    monkeypatch.setattr(hp, "decide", broken)
    monkeypatch.delenv("BOXY_DEBUG", raising=False)
    assert run_main(["hook", "claude"], event("npm i"), monkeypatch) == 2
    cap = capfd.readouterr()
    assert cap.out == "" and "Traceback" not in cap.err
    assert cap.err.count("\n") == 1 and "the command was blocked" in cap.err, cap.err


def test_fail_closed(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hook, "daemon_problem", lambda: "boxyd is not running")
    assert hook.claude(event("npm i")) == 0
    out = json.loads(capsys.readouterr().out)["hookSpecificOutput"]
    assert out["permissionDecision"] == "deny"
    assert "boxyd is not running" in out["permissionDecisionReason"]
    assert "updatedInput" not in out
    assert hook.claude(event("ls")) == 0  # not intercepted: boxyd is not asked
    assert capsys.readouterr().out == ""


def test_a_boxyd_that_does_not_answer_in_time_is_a_deny(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack finding F1b: a boxyd held up past the harness's timeout let Claude Code
    run the command as if the hook had said nothing. The hook's own deadline (under
    the harness's) denies instead."""
    import time

    finished: list[str] = []

    def held_up(cwd: str) -> None:
        time.sleep(30)  # a boxyd that does not answer
        finished.append(cwd)

    monkeypatch.setattr(hook, "ASK_DEADLINE", 0.2)
    monkeypatch.setattr(hook, "approved_profile", held_up)
    assert hook.claude(event("npm i")) == 0
    assert finished == []  # the wait was cut short: the deadline fired
    out = json.loads(capsys.readouterr().out)["hookSpecificOutput"]
    assert out["permissionDecision"] == "deny"
    assert "no answer within 0.2s" in out["permissionDecisionReason"]


def test_inside_a_sandbox_the_hook_leaves_it_to_the_harness(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claude Code run inside a sandbox (the claude preset) with boxy's hook in the
    project's settings: the command runs in that sandbox already, and no boxyd can be
    reached from there (issue 33 §2): no answer, so Claude Code asks as usual, never a
    deny of every command."""
    from boxy import paths

    mark = tmp_path / "container-manager"
    mark.write_text("boxy\n")
    monkeypatch.setattr(paths, "SANDBOX_MARK", str(mark))
    monkeypatch.setattr(hook, "daemon_problem", lambda: "already inside a boxy sandbox")
    assert hook.claude(event("npm i")) == 0
    assert capsys.readouterr().out == ""


def test_fail_open_when_configured(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (home / ".config/boxy").mkdir(parents=True)
    (home / ".config/boxy/hook.yaml").write_text("on_unavailable: ask\n")
    monkeypatch.setattr(hook, "daemon_problem", lambda: "boxyd is not running")
    assert hook.claude(event("npm i")) == 0
    assert capsys.readouterr().out == ""


def test_config(home: Path) -> None:
    (home / ".config/boxy").mkdir(parents=True)
    (home / ".config/boxy/hook.yaml").write_text(
        "intercept_also: [rm]\npassthrough: [make]\nprofiles: {cargo: offline}\n"
        "flags: [--net, none]\nshell: bash\nboxyctl: /usr/bin/boxyctl\n"
    )
    config, path = hook.load_config()
    assert path == "/usr/bin/boxyctl"
    assert "rm" in config.intercept and "npm" in config.intercept
    assert config.passthrough == ("make",) and config.profiles["cargo"] == "offline"
    assert config.profiles["npm"] == "node"
    assert (config.flags, config.shell) == (("--net", "none"), "bash")
    assert hook.load_config(home / "absent.yaml")[0] == hp.HookConfig()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("intercept: npm\n", "list of names"),
        ("intercepts: [npm]\n", "unknown key"),
        ("on_unavailable: allow\n", "on_unavailable"),
        ("profiles: [node]\n", "profiles"),
        ("shell: 3\n", "shell"),
        ("- a\n", "not a mapping"),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_bad_config_is_refused(
    home: Path, capsys: pytest.CaptureFixture[str], text: str, says: str
) -> None:
    (home / ".config/boxy").mkdir(parents=True)
    (home / ".config/boxy/hook.yaml").write_text(text)
    with pytest.raises(UsageError, match=says):
        hook.claude(event("npm i"))


def test_config_is_kept_only_for_the_file_it_was_parsed_from(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hook.yaml as parsed is kept beside boxyd's socket, used while the file is the
    one it came from, and checked as the file would be."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    path = home / ".config/boxy/hook.yaml"
    path.parent.mkdir(parents=True)
    path.write_text("flags: [--net, none]\n")
    cache = tmp_path / "run" / "boxy" / hook.CACHE_NAME
    # changed a moment ago: parsed each time, never kept (the kernel's clock ticks
    # coarsely: a second change in the same tick would keep every time of the file)
    assert hook.load_config()[0].flags == ("--net", "none")
    assert not cache.exists()
    monkeypatch.setattr(hook, "SETTLED", 0.0)
    assert hook.load_config()[0].flags == ("--net", "none")
    kept = json.loads(cache.read_text())
    assert kept["doc"] == {"flags": ["--net", "none"]} and kept["key"][0] == str(path)
    assert cache.stat().st_mode & 0o777 == 0o600
    # what is kept is what is used while the file is that file...
    cache.write_text(json.dumps({**kept, "doc": {"flags": ["--net", "public"]}}))
    assert hook.load_config()[0].flags == ("--net", "public")
    # ...but only from a directory of ours that no one else can write (/tmp/boxy-UID
    # may be another user's), and never through a symlink
    cache.parent.chmod(0o755)
    assert hook.load_config()[0].flags == ("--net", "none")
    cache.parent.chmod(0o700)
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps({**kept, "doc": {"flags": ["--net", "public"]}}))
    cache.unlink()
    cache.symlink_to(planted)
    assert hook.load_config()[0].flags == ("--net", "none")
    assert not cache.is_symlink()  # replaced by what was parsed
    # ...a change of it is read anew (and kept in its place)
    path.write_text("flags: [--net, none, -v]\n")
    assert hook.load_config()[0].flags == ("--net", "none", "-v")
    kept = json.loads(cache.read_text())
    assert kept["doc"] == {"flags": ["--net", "none", "-v"]}
    # ...and what is kept passes the same checks as the file
    cache.write_text(json.dumps({**kept, "doc": {"flags": "-v"}}))
    with pytest.raises(UsageError, match="list of names"):
        hook.load_config()
    # a cache that does not read is no cache
    cache.write_text("{")
    assert hook.load_config()[0].flags == ("--net", "none", "-v")


def test_approved_project(home: Path, tmp_path: Path) -> None:
    """boxyd's answer to the hook's Trusted (config/trust.py; the hook's call is
    tests/integration/test_hook.py's): approved as it is now, and not once changed."""
    from boxyd.config import projectconfig, trust

    def trusted(workdir: str) -> str | None:
        return trust.trusted(workdir, str(home), "u", {}, str(home / ".config"))

    proj = tmp_path / "proj"
    proj.mkdir()
    assert not trusted(str(proj))
    (proj / ".boxy.yaml").write_text("profile: node\n")
    assert not trusted(str(proj))
    env = projectconfig.run_env(str(home), "u", {})
    projectconfig.approve(projectconfig.read(str(proj), env), str(home / ".config"))
    assert trusted(str(proj)) == "node"  # the profile it names: the run's -p
    (proj / ".boxy.yaml").write_text("profile: python\n")  # changed: approval lapses
    assert not trusted(str(proj))


# --- hook install ---------------------------------------------------------------------

CMD = "/venv/bin/boxyctl hook claude"


def test_install_idempotent_and_keeps_other_keys(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    other: dict[str, Any] = {
        "model": "x",
        "permissions": {"allow": ["Bash(ls:*)"]},
        "hooks": {
            "PreToolUse": [{"matcher": "Edit", "hooks": [{"type": "command", "command": "f"}]}],
            "Stop": [{"hooks": [{"type": "command", "command": "g"}]}],
        },
    }
    path.write_text(json.dumps(other))
    assert hook.install(path, CMD, remove=False).startswith("installed")
    once = path.read_text()
    doc = json.loads(once)
    assert doc["model"] == "x" and doc["permissions"] == other["permissions"]
    assert doc["hooks"]["Stop"] == other["hooks"]["Stop"]
    groups = doc["hooks"]["PreToolUse"]
    assert groups[0] == other["hooks"]["PreToolUse"][0]
    assert groups[1] == {
        "matcher": "Bash",
        "hooks": [{"type": "command", "command": CMD, "timeout": hp.HOOK_TIMEOUT}],
    }
    assert "unchanged" in hook.install(path, CMD, remove=False)
    assert path.read_text() == once
    # another path to boxyctl: replaced, not added
    hook.install(path, "/other/boxyctl hook claude", remove=False)
    assert path.read_text().count("hook claude") == 1
    assert hook.install(path, CMD, remove=True).startswith("removed")
    assert json.loads(path.read_text()) == other
    assert "unchanged" in hook.install(path, CMD, remove=True)


def test_install_into_nothing_and_remove_leaves_no_tables(tmp_path: Path) -> None:
    path = tmp_path / ".claude" / "settings.json"
    hook.install(path, CMD, remove=False)
    assert os.stat(path).st_mode & 0o777 == 0o600
    hook.install(path, CMD, remove=True)
    assert json.loads(path.read_text()) == {}
    assert sorted(p.name for p in path.parent.iterdir()) == ["settings.json"]  # no temp file


def test_invalid_settings_refused_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    for text in ('{"a": 1,', "[1]", '{"hooks": []}', '{"hooks": {"PreToolUse": {}}}'):
        path.write_text(text)
        with pytest.raises(UsageError) as e:
            hook.install(path, CMD, remove=False)
        assert "\n" not in str(e.value) and "unchanged" in str(e.value)
        assert path.read_text() == text


def test_install_through_a_symlink_keeps_it(tmp_path: Path) -> None:
    real = tmp_path / "dotfiles" / "settings.json"
    real.parent.mkdir()
    real.write_text("{}")
    os.chmod(real, 0o644)
    link = tmp_path / "settings.json"
    link.symlink_to(real)
    hook.install(link, CMD, remove=False)
    assert link.is_symlink() and CMD in real.read_text()
    assert os.stat(real).st_mode & 0o777 == 0o644


def test_install_command_line(
    home: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    monkeypatch.chdir(proj)
    (home / ".config/boxy").mkdir(parents=True)  # this machine's boxyctl, by its path
    (home / ".config/boxy/hook.yaml").write_text("boxyctl: /opt/venv/bin/boxyctl\n")
    assert boxyctl_main.main(["hook", "install", "claude", "--project"]) == 0
    assert "installed" in capfd.readouterr().err
    settings = json.loads((proj / ".claude/settings.json").read_text())
    command = settings["hooks"]["PreToolUse"][0]["hooks"][0]["command"]
    # a project's settings are committed: no path of this machine's (issue 33 §2)
    assert command == "boxyctl hook claude"
    assert boxyctl_main.main(["hook", "install", "claude"]) == 0
    mine = json.loads((home / ".claude/settings.json").read_text())
    command = mine["hooks"]["PreToolUse"][0]["hooks"][0]["command"]
    assert command == "/opt/venv/bin/boxyctl hook claude"  # your own file: this machine's
    assert boxyctl_main.main(["hook", "install", "codex"]) == 2
    # an older install's absolute path in the project is replaced by the portable one
    hook.install(proj / ".claude/settings.json", "/old/venv/bin/boxyctl hook claude", remove=False)
    assert boxyctl_main.main(["hook", "install", "claude", "--project"]) == 0
    again = json.loads((proj / ".claude/settings.json").read_text())["hooks"]["PreToolUse"]
    assert again == [{"matcher": "Bash", "hooks": [{"type": "command",
                     "command": "boxyctl hook claude", "timeout": hp.HOOK_TIMEOUT}]}]  # fmt: skip


# --- boxy-sh ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "split"),
    [
        (["-c", "npm i", "a0", "x"], (["-c"], "npm i", ["a0", "x"])),
        (["-lc", "ls"], (["-lc"], "ls", [])),
        (["-o", "noclobber", "-e", "-c", "ls"], (["-o", "noclobber", "-e", "-c"], "ls", [])),
        (["script.sh", "a"], ([], None, ["script.sh", "a"])),
        (["-e", "script.sh"], (["-e"], None, ["script.sh"])),
        (["-c"], (["-c"], None, [])),
        ([], ([], None, [])),
    ],
)
def test_shim_split(args: list[str], split: tuple[list[str], str | None, list[str]]) -> None:
    from boxyctl import shim

    assert shim.split_args(args) == split


def test_shim_run_argv(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from boxyctl import shim

    monkeypatch.chdir(tmp_path)
    assert shim.run_argv(["-c", "ls -la"]) is None
    assert shim.run_argv(["script.sh"]) is None
    assert shim.run_argv(["-c", "npm i | tr a b", "zero", "one"]) == [
        "run", "-p", "node", "--", "sh", "-c", "npm i | tr a b", "zero", "one",
    ]  # fmt: skip
    (home / ".config/boxy").mkdir(parents=True)
    (home / ".config/boxy/hook.yaml").write_text('intercept: ["*"]\nflags: [--net, none]\n')
    assert shim.run_argv(["-c", "ls"]) == ["run", "--net", "none", "--", "sh", "-c", "ls"]
    assert shim.run_argv(["script.sh"]) == ["run", "--net", "none", "--", "sh", "script.sh"]


def test_shim_bad_config(
    home: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from boxyctl import shim

    (home / ".config/boxy").mkdir(parents=True)
    (home / ".config/boxy/hook.yaml").write_text("nope: 1\n")
    assert shim.main(["-c", "npm i"]) == 2
    err = capfd.readouterr().err
    assert err.startswith("boxy-sh: ") and err.count("\n") == 1
