"""boxyctl.cli: every subcommand, the Run parameters, and one-line refusals."""

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from boxy.errors import UsageError
from boxy.request import RunRequest
from boxyctl import cli
from boxyctl.cli import Command, parse, parse_or_exit, prog_name, usage

ENV = {
    "HOME": "/home/u",
    "USER": "u",
    "TERM": "xterm",
    "LANG": "C.UTF-8",
    "LC_TIME": "de_DE",
    "PATH": "/usr/bin",
    "SSH_AUTH_SOCK": "/tmp/ssh/agent",
    "XDG_RUNTIME_DIR": "/run/user/1000",
    "GITHUB_TOKEN": "ghp",
    "EDITOR": "vim",
}
CWD = "/home/u/proj"


def p(*argv: str, environ: dict[str, str] = ENV) -> Command:
    return parse(list(argv), environ=environ, cwd=CWD)


def wire(cmd: Command) -> dict[str, Any]:
    """A run's request as the Run call carries it."""
    assert cmd.name == "run"
    request: RunRequest = cmd.args["request"]
    return request.to_wire()


def run_opts(*argv: str, **kw: dict[str, str]) -> dict[str, Any]:
    options: dict[str, Any] = wire(p("run", *argv, "--", "true", **kw))["options"]
    return options


def refused(*argv: str, environ: dict[str, str] = ENV) -> str:
    with pytest.raises(UsageError) as e:
        p(*argv, environ=environ)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_run_defaults_are_exactly_the_run_parameters() -> None:
    cmd = p("run", "--", "npm", "ci")
    assert wire(cmd) == (
        {
            "argv": ["npm", "ci"],
            "cwd": CWD,
            "options": {
                "profile": None, "ro": [], "rw": [], "protect": [], "reveal": [], "mkdir": [], "copy": [],
                "copy_ro": [], "workdir": None, "net": None, "allow_host": [], "allow_port": [],
                "allow_cidr": [], "tailscale": False, "ask": False, "ask_timeout": None, "ask_notify": False, "publish": [], "env": [], "secret": [], "memory": None, "pids": None,
                "cpus": None, "timeout": None, "review_limit": None, "audit_log": None, "net_log": None, "pcap": None,
                "pcap_max": None, "seccomp": None, "tty": False, "tty_raw": False, "verbose": False,
                "detach": False, "allow_git_write": False, "review": False, "edit_config": [], "allow_host_config": [],
            },
            "client_env": {
                "HOME": "/home/u", "USER": "u", "TERM": "xterm", "LANG": "C.UTF-8",
                "LC_TIME": "de_DE", "SSH_AUTH_SOCK": "/tmp/ssh/agent",
                "XDG_RUNTIME_DIR": "/run/user/1000", "PATH": "/usr/bin",
            },
        }
    )  # fmt: skip


def test_the_request_survives_the_wire() -> None:
    """What the CLI builds is what the daemon decodes, every option included."""
    from boxy.request import OPTIONS

    cmd = p(
        "run",
        "-p",
        "node",
        "--ro",
        "/data",
        "--copy",
        "/a:/b",
        "-e",
        "X=1",
        "-e",
        "NOPE",
        "--secret",
        "GITHUB_TOKEN",
        "--allow-host",
        "example.org:443",
        "--allow-port",
        "8443",
        "--memory",
        "1GiB",
        "--cpus",
        "1.5",
        "--timeout",
        "10m",
        "--tty",
        "--",
        "npm",
        "ci",
    )
    request = cmd.args["request"]
    assert sorted(run_opts()) == sorted(OPTIONS)
    assert RunRequest.from_wire(request.to_wire()) == request
    assert "ghp" not in repr(request)  # a secret's value never shows in a repr


@pytest.mark.parametrize(
    "argv,command",
    [
        (["--", "ls", "-la"], ["ls", "-la"]),
        (["ls", "-la"], ["ls", "-la"]),
        (["--net", "none", "ls", "--net", "x"], ["ls", "--net", "x"]),
        (["ls", "--", "x"], ["ls", "--", "x"]),
        (["--", "--", "x"], ["--", "x"]),
        (["-v", "--", "-weird"], ["-weird"]),
    ],
)
def test_command_with_or_without_double_dash(argv: list[str], command: list[str]) -> None:
    assert wire(p("run", *argv))["argv"] == command


@pytest.mark.parametrize(
    "argv", [["run"], ["run", "--"], ["run", "-v"], ["run", "-p", "node", "--"]]
)
def test_missing_command(argv: list[str]) -> None:
    assert refused(*argv).startswith("run: missing command")


def test_every_flag() -> None:
    o = run_opts(
        "-p", "node", "--ro", "a", "--ro", "/abs", "--rw", "~/data", "--protect", "./.env", "--reveal", ".npmrc",
        "--mkdir", "~", "--allow-git-write", "--review", "--edit-config", ".claude", "--allow-host-config", "~/.ssh", "--copy", "~/c.json", "--copy", "x:/etc/y",
        "--copy-ro", "r:~/r", "-w", "../../..", "--net", "allowlist", "--allow-host", "A.example",
        "--allow-host", "nas:22,2222", "--allow-host", "dns.example:53/udp", "--allow-port", "8080",
        "--allow-cidr", "192.168.4.0/24", "--tailscale", "--ask", "--ask-timeout", "2m", "--ask-notify", "--publish", "3000:3000", "-e", "EDITOR", "--env", "X=1=2",
        "-e", "NOPE", "--secret", "EDITOR", "--memory", "1GiB", "--pids", "64", "--cpus", "0.5", "--timeout", "1h30m", "--review-limit", "1GiB",
        "--audit-log", "a.json", "--net-log", "/var/tmp/n.json", "--pcap", "c.pcap",
        "--pcap-max", "10MiB", "--seccomp", "compat", "--tty", "--tty-raw", "-v", "-d",
    )  # fmt: skip
    assert o == {
        "profile": "node",
        "ro": ["/home/u/proj/a", "/abs"],
        "rw": ["/home/u/data"],
        "protect": ["/home/u/proj/.env"],
        "reveal": ["/home/u/proj/.npmrc"],
        "mkdir": ["/home/u"],
        "copy": [
            {"src": "/home/u/c.json", "dst": None},
            {"src": "/home/u/proj/x", "dst": "/etc/y"},
        ],
        "copy_ro": [{"src": "/home/u/proj/r", "dst": "/home/u/r"}],
        "workdir": "/",  # made absolute, and a directory (the client checks -w)
        "net": "allowlist",
        "allow_host": ["a.example", "nas:22,2222", "dns.example:53/udp"],
        "allow_port": [8080],
        "allow_cidr": ["192.168.4.0/24"],
        "tailscale": True,
        "ask": True,
        "ask_timeout": 120.0,
        "ask_notify": True,
        "publish": ["127.0.0.1:3000:3000"],
        "env": [
            {"name": "EDITOR", "value": "vim", "present": True},
            {"name": "X", "value": "1=2", "present": True},
            {"name": "NOPE", "value": None, "present": False},
        ],
        "secret": [{"name": "EDITOR", "value": "vim"}],
        "memory": 1 << 30,
        "pids": 64,
        "cpus": 0.5,
        "timeout": 5400.0,
        "review_limit": 1 << 30,
        "audit_log": "/home/u/proj/a.json",
        "net_log": "/var/tmp/n.json",
        "pcap": "/home/u/proj/c.pcap",
        "pcap_max": 10 << 20,
        "seccomp": "compat",
        "tty": True,
        "tty_raw": True,
        "verbose": True,
        "detach": True,
        "allow_git_write": True,
        "review": True,
        "edit_config": ["/home/u/proj/.claude"],
        "allow_host_config": ["/home/u/.ssh"],
    }


def test_profile_path_made_absolute() -> None:
    assert run_opts("-p", "my.yaml")["profile"] == "/home/u/proj/my.yaml"
    assert run_opts("-p", "~/p/x.yml")["profile"] == "/home/u/p/x.yml"
    assert run_opts("-p", "./conf/x")["profile"] == "/home/u/proj/conf/x"
    assert run_opts("-p", "claude")["profile"] == "claude"


def test_client_env_never_carries_secrets() -> None:
    env = wire(p("run", "true"))["client_env"]
    assert "GITHUB_TOKEN" not in env and "EDITOR" not in env
    # PATH travels (the daemon asks the user's own npm/pip for their registry) but never
    # becomes the sandbox's: that is envpolicy's sandbox PATH.
    assert env["PATH"] == "/usr/bin"


def test_e_name_reads_the_client_environment() -> None:
    assert run_opts("-e", "GITHUB_TOKEN")["env"] == [
        {"name": "GITHUB_TOKEN", "value": "ghp", "present": True}
    ]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["run", "--bogus", "ls"], "--bogus: unknown flag"),
        (
            ["run", "--mem", "1G", "ls"],
            "--mem: unknown flag (did you mean --memory?)",
        ),  # no abbreviations
        (
            ["run", "--memory", "2XB", "ls"],
            "--memory: '2XB' is not a size (examples: 512MiB, 2GiB)",
        ),
        (["run", "--memory", "0", "ls"], "--memory: '0' is zero"),
        (["run", "--memory"], "--memory: expected one argument"),
        (["run", "--pids", "-1", "ls"], "--pids: -1 is negative"),
        (["run", "--cpus", "0", "ls"], "--cpus: '0' is zero"),
        (["run", "--timeout", "soon", "ls"], "--timeout: 'soon' is not a duration"),
        (["run", "--pcap", "c", "--pcap-max", "1XB", "ls"], "--pcap-max: '1XB' is not a size"),
        (["run", "--net", "open", "ls"], "--net: 'open' is not one of public, allowlist, none"),
        (["run", "--seccomp", "off", "ls"], "--seccomp: 'off' is not one of strict, compat"),
        (["run", "--allow-host", "a.example:0", "ls"], "is not a port number"),
        (["run", "--allow-host", "[10.0.0.1]", "ls"], "not a host name"),
        (["run", "--allow-port", "65536", "ls"], "--allow-port: '65536' is not a port number"),
        (["run", "--allow-cidr", "0.0.0.0/0", "ls"], "would permit every address"),
        (["run", "--allow-cidr", "::/0", "ls"], "would permit every address"),
        (
            ["run", "--allow-cidr", "10.0.2.0/23", "ls"],
            "overlaps the sandbox's own network 10.0.2.0/24",
        ),
        (
            ["run", "--allow-cidr", "fd00::/16", "ls"],
            "overlaps the sandbox's own network fd00::/64",
        ),
        (["run", "--allow-cidr", "lan", "ls"], "is not an address range"),
        (["run", "-e", "1X", "ls"], "-e '1X': not a valid variable name"),
        (["run", "-e", "=v", "ls"], "not a valid variable name"),
        (["run", "--ro", "", "ls"], "--ro: empty path"),
        (["run", "--ro", "~root/x", "ls"], "--ro ~root/x: only ~ and ~/ are expanded"),
        (["run", "--copy", "a:", "ls"], "--copy 'a:': expected SRC[:DST]"),
        (["run", "--copy", ":b", "ls"], "expected SRC[:DST]"),
        (["run", "--copy-ro", "a:rel", "ls"], "DST must be an absolute path"),
        (["run", "-p", "", "ls"], "--profile: empty name"),
        (
            ["run", "--pcap", "c", "--net", "none", "ls"],
            "--pcap: cannot be combined with --net none",
        ),
        (
            ["run", "--allow-host", "a.b", "--net", "none", "ls"],
            "--allow-host: cannot be combined with --net none",
        ),
        (
            ["run", "--allow-host", "a.b", "--net", "public", "ls"],
            "--allow-host: cannot be combined with --net public",
        ),
        (
            ["run", "--tailscale", "--net", "none", "ls"],
            "--tailscale: cannot be combined with --net none",
        ),
        (["run", "--allow-port", "22", "--net", "none", "ls"], "--allow-port: cannot be combined"),
        (
            ["run", "--allow-cidr", "192.168.1.0/24", "--net", "none", "ls"],
            "--allow-cidr: cannot be combined",
        ),
        (["run", "--pcap-max", "1GiB", "ls"], "--pcap-max: needs --pcap"),
        ([], "missing command (run, ps, show"),
        (["frobnicate"], "frobnicate: not a command; one of: run, ps,"),
        (["--bogus"], "--bogus: unknown flag"),
        (["show"], "show: the following arguments are required: ID"),
        (["stop", "-k"], "stop: the following arguments are required: ID"),
        (["show", "../x"], "'../x' is not a session id"),
        (["ps", "extra"], "unrecognized arguments: extra"),
        (["profile"], "profile: missing action (list, show NAME)"),
        (["profile", "edit"], "profile: edit: not an action; one of: list, show"),
        (["profile", "show"], "the following arguments are required: NAME"),
        (["daemon"], "daemon: missing action (status, restart, stop)"),
        (["daemon", "kill"], "daemon: kill: not an action; one of: status"),
    ],
)
def test_refusals(argv: list[str], message: str) -> None:
    assert message in refused(*argv)


def test_tilde_without_home() -> None:
    assert "HOME is not set" in refused("run", "--ro", "~/x", "ls", environ={})


def test_relative_or_removed_cwd_refused_for_run_only() -> None:
    with pytest.raises(UsageError, match="not an absolute path"):
        parse(["run", "--", "ls"], environ=ENV, cwd="rel")
    with pytest.raises(UsageError, match="the current directory was removed"):
        parse(["run", "--", "ls"], environ=ENV, cwd="")
    assert parse(["ps"], environ=ENV, cwd="").name == "ps"  # needs no directory


@pytest.mark.parametrize(
    "argv,command",
    [
        (["ps"], Command("ps", {"all": False, "quiet": False, "json": False})),
        (["ps", "-a"], Command("ps", {"all": True, "quiet": False, "json": False})),
        (["ps", "-q", "--json"], Command("ps", {"all": False, "quiet": True, "json": True})),
        (["show", "9f3c1ba2"], Command("show", {"id": "9f3c1ba2", "json": False})),
        (["show", "--json", "9f3c"], Command("show", {"id": "9f3c", "json": True})),
        (["logs", "-f", "9f3c"], Command("logs", {"id": "9f3c", "follow": True})),
        (["watch"], Command("watch", {"id": None})),
        (["watch", "9f3c1ba2"], Command("watch", {"id": "9f3c1ba2"})),
        (["attach", "9f3c1ba2"], Command("attach", {"id": "9f3c1ba2"})),
        (
            ["stop", "9f3c1ba2"],
            Command("stop", {"ids": ["9f3c1ba2"], "kill": False, "json": False}),
        ),
        (
            ["stop", "-k", "9f3c1ba2"],
            Command("stop", {"ids": ["9f3c1ba2"], "kill": True, "json": False}),
        ),
        (
            ["stop", "ab", "cd", "--json"],
            Command("stop", {"ids": ["ab", "cd"], "kill": False, "json": True}),
        ),
        (["doctor"], Command("doctor", {"json": False})),
        (["doctor", "--json"], Command("doctor", {"json": True})),
        (["profile", "list"], Command("profile", {"action": "list", "json": False})),
        (
            ["profile", "show", "node", "--json"],
            Command("profile", {"action": "show", "name": "node", "json": True}),
        ),
        (["daemon", "status"], Command("daemon", {"action": "status", "json": False})),
        (["daemon", "status", "--json"], Command("daemon", {"action": "status", "json": True})),
        (["daemon", "restart"], Command("daemon", {"action": "restart", "force": False})),
        (["daemon", "stop"], Command("daemon", {"action": "stop", "force": False})),
        (["daemon", "stop", "--force"], Command("daemon", {"action": "stop", "force": True})),
        (["--version"], Command("version", {})),
    ],
)
def test_subcommands(argv: list[str], command: Command) -> None:
    assert p(*argv) == command


def test_help() -> None:
    top = p("--help")
    assert top.name == "help" and "run" in top.args["text"] and "daemon" in top.args["text"]
    run = p("run", "--help")
    assert run.name == "help"
    for flag in ["--profile", "--allow-host", "--pcap-max", "--seccomp", "--detach", "--copy-ro"]:
        assert flag in run.args["text"]
    assert usage("boxy", "run").startswith("usage: boxy run [flags] -- COMMAND [ARGS...]")
    assert usage().startswith("usage: boxyctl")


def test_parse_or_exit_prints_one_line_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse_or_exit(["run", "--memory", "2XB", "ls"], environ=ENV, cwd=CWD, prog="boxy")
    assert e.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "boxy: --memory: '2XB' is not a size (examples: 512MiB, 2GiB)\n"


def test_prog_name() -> None:
    assert prog_name("/usr/bin/boxy") == "boxy"
    assert prog_name("boxyctl") == "boxyctl"
    assert prog_name("/tmp/x/__main__.py") == "boxyctl"


def test_imports_stay_light() -> None:
    code = (
        "import sys, boxyctl.cli; "
        "bad = [m for m in ('yaml', 'asyncio', 'dbus_fast', 'boxyd.config.spec', 'boxyd.config.profiles') "
        "if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _both(argv: list[str]) -> tuple[RunRequest | str | None, RunRequest | str]:
    """(fast path result, argparse result) for `run` ARGV: each a dict, the error
    text, or None when the fast path declined."""
    from boxyctl import cli as c

    def finish(ns: SimpleNamespace) -> RunRequest | str:
        try:
            return c._run_request(ns, dict(ENV), CWD)
        except UsageError as e:
            return f"error: {e}"

    fast = c._fast_run(argv)
    try:
        slow: RunRequest | str = c._parse_with_argparse(
            ["run", *argv], environ=dict(ENV), cwd=CWD, prog="boxyctl"
        ).args["request"]
    except UsageError as e:
        slow = f"error: {e}"
    return (None if fast is None else finish(fast)), slow


def test_fast_path_agrees_with_argparse_wherever_it_answers() -> None:
    import random

    from boxy.options import RUN_OPTIONS

    rng = random.Random(1234)
    values = [
        "none",
        "public",
        "allowlist",
        "strict",
        "compat",
        "2GiB",
        "10",
        "1.5",
        "/tmp/x",
        "~/p",
        "rel/path",
        "a.example:443",
        "192.168.4.0/24",
        "NAME",
        "NAME=v",
        "",
        "-x",
        "--",
        "a=b",
        "10m",
    ]
    answered = 0
    for _ in range(3000):
        argv: list[str] = []
        for _ in range(rng.randint(0, 5)):
            flag = rng.choice(RUN_OPTIONS)
            name = rng.choice(flag.names)
            if flag.kind == "true":
                argv.append(name if rng.random() > 0.05 else name + "=1")
            elif name.startswith("--") and rng.random() < 0.3:
                argv.append(f"{name}={rng.choice(values)}")
            else:
                argv += [name, rng.choice(values)] if rng.random() > 0.05 else [name]
        argv += rng.choice([["--", "true"], ["true", "-v"], ["--"], [], ["ls", "--", "-la"]])
        fast, slow = _both(argv)
        if fast is not None:
            answered += 1
            assert fast == slow, argv
    assert answered > 1000  # the fast path takes the common lines


@pytest.mark.parametrize(
    "argv",
    [
        ["--net", "none", "--", "true"],
        ["-e", "A=b", "-v", "sh", "-c", "x"],
        ["--ro=/etc/hosts", "--timeout", "5s", "make", "-j4"],
        ["--tty", "--", "-weird-cmd"],
    ],
)
def test_fast_path_takes_plain_run_lines(argv: list[str]) -> None:
    fast, slow = _both(argv)
    assert fast is not None and fast == slow


def test_a_flag_given_no_value_is_one_line_not_a_traceback() -> None:
    # argparse reads '--pids=--' as an empty value list
    for argv in (["--pids=--", "true"], ["--ro=--", "true"]):
        assert "expected one value" in refused("run", *argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["-h"],
        ["--bogus", "x"],
        ["-vd", "true"],
        ["-pnode", "true"],
        ["--net", "nope", "true"],
        ["--memory"],
        ["--ro", "-x", "true"],
        ["--tty=yes", "true"],
        ["-", "true"],
    ],
)
def test_fast_path_leaves_the_rest_to_argparse(argv: list[str]) -> None:
    from boxyctl.cli import _fast_run

    assert _fast_run(argv) is None


def test_allow_port_with_public_is_refused() -> None:
    assert "cannot be combined with --net public" in refused(
        "run", "--net", "public", "--allow-port", "22", "true"
    )


def test_net_log_with_none_is_refused() -> None:
    assert "--net-log: cannot be combined with --net none" in refused(
        "run", "--net", "none", "--net-log", "/tmp/n.json", "true"
    )


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--secret", "TOKEN=hunter2"],
            "--secret TOKEN: takes a name; the value comes from your environment",
        ),
        (["--secret", "ABSENT"], "--secret ABSENT: not set in your environment"),
        (["--secret", "1BAD"], "not a valid variable name"),
    ],
)
def test_secret_refusals_never_show_a_value(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as e:
        p("run", *argv, "--", "true")
    assert message in str(e.value) and "hunter2" not in str(e.value)


def test_a_scalar_flag_given_twice_with_different_values_is_refused() -> None:
    env, cwd = {"HOME": "/home/u"}, "/home/u/proj"
    with pytest.raises(
        UsageError, match=r"^--net given twice \(none, then public\); give it once$"
    ):
        cli.parse(["run", "--net", "none", "--net", "public", "true"], environ=env, cwd=cwd)
    with pytest.raises(UsageError, match=r"^--memory given twice \(1GiB, then 2GiB\)"):
        cli.parse(["run", "--memory=1GiB", "--memory", "2GiB", "true"], environ=env, cwd=cwd)
    # the same value twice says nothing different: accepted; lists add up
    cli.parse(["run", "--net", "none", "--net", "none", "true"], environ=env, cwd=cwd)
    cli.parse(["run", "--ro", "/a", "--ro", "/b", "true"], environ=env, cwd=cwd)
    # after the command it is the command's
    cli.parse(["run", "--net", "none", "sh", "--net", "public"], environ=env, cwd=cwd)


def test_a_run_flag_after_the_command_is_said_and_the_run_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env, cwd = {"HOME": "/home/u"}, "/home/u/proj"
    cmd = cli.parse(["run", "sh", "-c", "true", "--net", "none"], environ=env, cwd=cwd)
    assert cmd.args["request"].argv == ["sh", "-c", "true", "--net", "none"]
    assert capsys.readouterr().err == (
        "boxyctl: --net: after the command sh, so passed to it, not to boxyctl run "
        "(run's flags go before the command)\n"
    )
    for argv in (["--", "sh", "--net", "none"], ["node", "-e", "1"], ["npm", "--verbose"]):
        cli.parse(["run", *argv], environ=env, cwd=cwd)
        assert capsys.readouterr().err == ""


def test_a_url_for_allow_host_says_what_to_write_instead() -> None:
    env, cwd = {"HOME": "/home/u"}, "/home/u/proj"
    for url, want in (
        ("https://example.com/", "--allow-host example.com"),
        ("https://u:p@example.com:8443/x", "--allow-host example.com:8443"),
    ):
        with pytest.raises(UsageError) as e:
            cli.parse(["run", "--allow-host", url, "true"], environ=env, cwd=cwd)
        assert str(e.value) == f"--allow-host: {url!r} is a URL; give its host alone: {want}"


def test_net_none_with_allow_cidr_names_the_real_conflict() -> None:
    env, cwd = {"HOME": "/home/u"}, "/home/u/proj"
    with pytest.raises(UsageError) as e:
        cli.parse(
            ["run", "--net", "none", "--allow-cidr", "10.0.2.0/24", "true"], environ=env, cwd=cwd
        )
    assert str(e.value) == "--allow-cidr: cannot be combined with --net none (no network at all)"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["rn"], "rn: not a command (did you mean run?); one of: run, ps,"),
        (["profile", "shw"], "profile: shw: not an action (did you mean show?); one of: list, show"),
        (["run", "--nett", "none", "true"], "--nett: unknown flag (did you mean --net?)"),
        (["ps", "--al"], "--al: unknown flag (did you mean --all?)"),
        (["run", "--net", "nne", "x"], "--net: 'nne' is not one of public, allowlist, none (did you mean none?)"),
    ],
)  # fmt: skip
def test_a_mistyped_command_or_flag_gets_a_suggestion(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as e:
        parse(argv, environ={"HOME": "/home/u"}, cwd="/home/u")
    assert str(e.value).startswith(message) and "COMMAND" not in str(e.value)


def test_an_unknown_profile_name_is_refused_in_the_client(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    with pytest.raises(UsageError) as e:
        parse(["run", "-p", "nod", "true"], environ=env, cwd=str(tmp_path))
    assert str(e.value).startswith("--profile nod: no such profile (did you mean node? presets: ")
    assert parse(["run", "-p", "node", "true"], environ=env, cwd=str(tmp_path)).name == "run"
    mine = tmp_path / ".config" / "boxy" / "profiles"
    mine.mkdir(parents=True)
    (mine / "nod.yaml").write_text("extends: node\n")
    assert parse(["run", "-p", "nod", "true"], environ=env, cwd=str(tmp_path)).name == "run"


@pytest.mark.parametrize(
    "command", ["ps", "show", "watch", "attach", "stop", "doctor", "setup", "completion"]
)
def test_every_command_has_a_description_and_its_arguments_help(command: str) -> None:
    from boxyctl.commands.table import BY_NAME

    text = usage("boxyctl", command)
    assert BY_NAME[command].description.split()[0] in text.splitlines()[2]
    if "positional arguments:" in text:
        args = text.partition("positional arguments:\n")[2].split("\n\n")[0]
        assert all(len(line.split()) > 1 for line in args.splitlines() if line.startswith("  "))


def test_help_says_the_exit_statuses() -> None:
    for command in (None, "run"):
        text = usage("boxyctl", command)
        assert "exit status:" in text and "2 for bad input" in text


def test_run_without_a_command_is_the_shell_on_a_terminal_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from boxyctl import cli

    monkeypatch.setattr(cli, "_on_terminal", lambda: False)
    with pytest.raises(UsageError, match="run: missing command"):
        parse(["run", "--net", "none"], environ=ENV, cwd="/w")
    monkeypatch.setattr(cli, "_on_terminal", lambda: True)
    env = {**ENV, "SHELL": "/usr/bin/zsh"}
    got = parse(["run", "--net", "none"], environ=env, cwd="/w").args["request"]
    assert got.argv == ["/bin/sh", "-c", cli.SHELL_PICK, "/usr/bin/zsh"]
    assert got.options.net == "none"
    assert cli.shell_command("zsh")[-1] == ""  # not a path: bash, else sh


@pytest.mark.parametrize(
    ("asked", "started"), [("/bin/sh", "/bin/sh"), ("/no/such/zsh", "/bin/bash"), ("", "/bin/bash")]
)
def test_the_shell_picked_is_the_one_shell_names(asked: str, started: str) -> None:
    """The pick run by a real /bin/sh: the shell it starts reads its commands from
    stdin here, and its $SHELL is itself, not the environment's /bin/sh (issue 33 §2)."""
    import subprocess

    from boxyctl import cli

    r = subprocess.run(
        cli.shell_command(asked),
        input=b'echo "$SHELL ${BASH_VERSION:+bash}"\n',
        capture_output=True,
        env={"PATH": "/usr/bin:/bin", "SHELL": "/bin/sh"},
        check=True,
    )
    assert r.stdout.decode().split() == [started, *(["bash"] if started == "/bin/bash" else [])]
