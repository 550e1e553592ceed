"""boxyd.config.spec.build_spec: merging flags and profile into a checked RunSpec."""

import os
import re
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

import pytest

from boxy.errors import ProfileError, SecretsNeeded, UsageError
from boxy.request import RunRequest
from boxyctl.cli import parse
from boxyd.config.profiles import Registry
from boxyd.config.runspec import CopyEntry, PathEntry, RunSpec
from boxyd.config.spec import build_spec


class Fs(TypedDict):
    """The fs fixture: a home with a project in it."""

    tmp: Path
    home: str
    wd: str


@pytest.fixture
def fs(tmp_path: Path) -> Fs:
    home = tmp_path / "home"
    wd = home / "proj"
    wd.mkdir(parents=True)
    (wd / ".env").write_text("x")
    (home / "data").mkdir()
    (home / "file.txt").write_text("f")
    return {"tmp": tmp_path, "home": str(home), "wd": str(wd)}


def build(
    fs: Fs,
    argv: Sequence[str] = ("true",),
    client_env: dict[str, str] | None = None,
    registry: Registry | None = None,
    **options: object,
) -> RunSpec:
    params = {
        "argv": list(argv),
        "cwd": fs["wd"],
        "options": options,
        "client_env": client_env or {},
    }
    # decoded as the daemon decodes a Run call: a wrong shape is refused there
    return build_spec(
        RunRequest.from_wire(params), uid=os.getuid(), user="u", home=fs["home"], registry=registry
    )


def test_defaults(fs: Fs) -> None:
    spec = build(fs)
    assert spec.argv == ["true"]
    assert spec.workdir == fs["wd"]
    assert spec.profile == "generic"
    assert spec.net == "public"
    assert (spec.memory, spec.pids, spec.cpus, spec.timeout) == (2 << 30, 512, None, None)
    assert spec.seccomp == "strict"
    assert spec.pcap_max == 1 << 30
    assert spec.env["HOME"] == fs["home"]
    assert spec.env["USER"] == spec.env["LOGNAME"] == "u"
    assert not (spec.ro or spec.rw or spec.copy or spec.notes)


def test_missing_command(fs: Fs) -> None:
    with pytest.raises(UsageError, match="missing command"):
        build(fs, argv=[])


def test_workdir_flag_relative_and_realpath(fs: Fs) -> None:
    os.symlink(fs["wd"], os.path.join(fs["home"], "link"))
    assert build(fs, workdir="../link").workdir == fs["wd"]


def test_workdir_not_a_directory(fs: Fs) -> None:
    with pytest.raises(UsageError) as e:
        build(fs, workdir=fs["home"] + "/file.txt")
    assert str(e.value) == f"--workdir {fs['home']}/file.txt: not a directory"
    with pytest.raises(UsageError, match="--workdir .*/nope: no such directory"):
        build(fs, workdir="nope")


def test_a_workdir_you_cannot_write_is_refused(fs: Fs, monkeypatch: pytest.MonkeyPatch) -> None:
    """-w /etc, or a run started in /usr/share: the work directory is the writable
    project, so one the user cannot write is no project (issue 33 §2); one line.
    (The suite may run as root, who can write anything: os.access answers as a user.)"""
    real_access = os.access
    closed = fs["home"] + "/data"

    def access(path: Any, mode: int, **kw: Any) -> bool:
        if os.fspath(path) == closed and mode & os.W_OK:
            return False
        return real_access(path, mode, **kw)

    monkeypatch.setattr(os, "access", access)
    with pytest.raises(UsageError) as e:
        build(fs, workdir=closed)
    assert str(e.value) == (
        f"--workdir {closed}: not writable by you, and the work directory is the run's "
        "writable project; pass -w PATH (--ro exposes a directory read-only)"
    )
    req = RunRequest.from_wire({"argv": ["true"], "cwd": closed, "options": {}, "client_env": {}})
    with pytest.raises(UsageError) as e:
        build_spec(req, uid=os.getuid(), user="u", home=fs["home"])
    assert str(e.value).startswith(f"the current directory {closed}: not writable by you")
    assert "cd into a project or pass -w PATH" in str(e.value)


def test_flag_paths_must_exist(fs: Fs) -> None:
    for kind in ("ro", "rw", "protect"):
        options: dict[str, Any] = {kind: ["/no/such/x"]}  # wire options, as decoded
        with pytest.raises(UsageError) as e:
            build(fs, **options)
        assert str(e.value) == f"--{kind} /no/such/x: no such file or directory"


def test_ro_rw_added(fs: Fs) -> None:
    spec = build(fs, ro=["/usr/share"], rw=[fs["home"] + "/data"])
    assert spec.ro == [PathEntry("/usr/share")]
    assert spec.rw == [PathEntry(fs["home"] + "/data")]


def test_ro_and_rw_same_path(fs: Fs) -> None:
    # a path whoever runs the suite can write: /usr/share is writable by root only,
    # and for anyone else --rw's own check ("not writable by you") came first
    data = fs["home"] + "/data"
    with pytest.raises(UsageError, match="both read-only and read-write"):
        build(fs, ro=[data], rw=[data])


def test_paths_keep_their_given_form(fs: Fs) -> None:
    """A symlink is mounted at its own path; the kernel resolves the source."""
    link = fs["home"] + "/dlink"
    os.symlink(fs["home"] + "/data", link)
    assert build(fs, ro=[link]).ro == [PathEntry(link)]


def test_mkdir(fs: Fs) -> None:
    spec = build(fs, mkdir=[fs["home"] + "/new/dir"])
    assert spec.mkdir == [PathEntry(fs["home"] + "/new/dir")]
    with pytest.raises(UsageError, match="exists and is not a directory"):
        build(fs, mkdir=[fs["home"] + "/file.txt"])


def test_protect(fs: Fs) -> None:
    spec = build(fs, protect=[".env"], rw=[fs["home"] + "/data"])
    assert spec.protect == [PathEntry(fs["wd"] + "/.env")]
    assert build(fs, protect=[fs["home"] + "/data"], rw=[fs["home"] + "/data"]).protect
    with pytest.raises(UsageError, match="not inside the work directory or a --rw path"):
        build(fs, protect=[fs["home"] + "/file.txt"])
    os.symlink(".env", fs["wd"] + "/envlink")
    with pytest.raises(UsageError, match="is a symlink"):
        build(fs, protect=["envlink"])


def test_copy(fs: Fs) -> None:
    src = fs["home"] + "/file.txt"
    spec = build(fs, copy=[{"src": src, "dst": None}], copy_ro=[{"src": src, "dst": "/opt/f"}])
    assert spec.copy == [CopyEntry(src, src)]
    assert spec.copy_ro == [CopyEntry(src, "/opt/f")]


def test_copy_errors(fs: Fs) -> None:
    with pytest.raises(UsageError) as e:
        build(fs, copy=[{"src": "/no/such", "dst": None}])
    assert str(e.value) == "--copy /no/such: no such file or directory"
    with pytest.raises(UsageError, match="--copy-ro .*/data: not a regular file"):
        build(fs, copy_ro=[{"src": fs["home"] + "/data", "dst": "/x"}])
    with pytest.raises(UsageError, match="the destination must be absolute"):
        build(fs, copy=[{"src": fs["home"] + "/file.txt", "dst": "rel"}])
    with pytest.raises(UsageError, match="a second copy to /x"):
        src = fs["home"] + "/file.txt"
        build(fs, copy=[{"src": src, "dst": "/x"}], copy_ro=[{"src": src, "dst": "/x"}])


def test_copy_into_an_exposed_tree_refused(fs: Fs) -> None:
    with pytest.raises(UsageError, match="destination lies inside the exposed path"):
        build(fs, copy=[{"src": fs["home"] + "/file.txt", "dst": fs["wd"] + "/f"}])


def profile_file(fs: Fs, text: str) -> str:
    path = os.path.join(fs["tmp"], "prof.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def test_profile_optional_entries_skipped_with_note(fs: Fs) -> None:
    path = profile_file(
        fs,
        "filesystem:\n  ro: [{path: /no/such, optional: true}, /usr/share]\n"
        "  copy: [{src: ~/absent.json, optional: true}]\n",
    )
    spec = build(fs, profile=path)
    assert spec.profile == path
    assert spec.ro == [PathEntry("/usr/share")]
    assert not spec.copy
    assert any("/no/such: absent; skipped" in n for n in spec.notes)
    assert any("absent.json: absent; skipped" in n for n in spec.notes)


def test_profile_required_entry_missing(fs: Fs) -> None:
    path = profile_file(fs, "filesystem:\n  rw: [/no/such]\n")
    with pytest.raises(ProfileError, match=f"profile {path}: filesystem.rw /no/such: no such"):
        build(fs, profile=path)


def test_profile_relative_path_against_cwd(fs: Fs) -> None:
    profile_file(fs, "net: none\n")
    assert build(fs, profile="../../prof.yaml").net == "none"


def test_claude_profile(fs: Fs) -> None:
    home = fs["home"]
    os.makedirs(home + "/.claude")
    os.makedirs(home + "/.config/boxy")
    with open(home + "/.claude/.credentials.json", "w") as f:
        f.write("{}")
    with open(home + "/.config/boxy/claude-mcp.json", "w") as f:
        f.write("{}")
    with open(home + "/other.json", "w") as f:
        f.write("{}")
    spec = build(fs, profile="claude")
    slug = re.sub(r"[^A-Za-z0-9]", "-", fs["wd"])
    assert spec.mkdir == [PathEntry(f"{home}/.claude/projects/{slug}")]
    assert [c.dst for c in spec.copy] == [
        f"{home}/.claude/.credentials.json",
        f"{home}/.claude.json",
    ]
    assert not spec.copy_ro and not spec.ro  # CLAUDE.md and the binary are absent here
    assert spec.env["DISABLE_AUTOUPDATER"] == "1"
    assert spec.allow_hosts[0] == "api.anthropic.com"
    # a flag copy to the same destination replaces the profile's
    spec = build(
        fs, profile="claude", copy=[{"src": home + "/other.json", "dst": home + "/.claude.json"}]
    )
    assert CopyEntry(home + "/other.json", home + "/.claude.json") in spec.copy
    assert len([c for c in spec.copy if c.dst == home + "/.claude.json"]) == 1
    assert any("replaced by --copy" in n for n in spec.notes)


def test_allow_host_implies_allowlist(fs: Fs) -> None:
    spec = build(fs, allow_host=["github.com", "nas:22"])
    assert spec.net == "allowlist"
    assert spec.allow_hosts == ["github.com", "nas:22"]
    assert spec.allow_ports == []  # nas:22 stays with nas


def test_allow_host_with_an_offline_profile_needs_the_net_flag(fs: Fs) -> None:
    """Not silently: `-p offline --allow-host x` is refused like `--net none --allow-host x`."""
    with pytest.raises(
        UsageError,
        match="the profile offline has no network .net: none.; give --net allowlist as well",
    ):
        build(fs, profile="offline", allow_host=["a.example"])
    assert (
        build(fs, profile="offline", allow_host=["a.example"], net="allowlist").net == "allowlist"
    )


def test_registry_templates_resolved(fs: Fs) -> None:
    spec = build(
        fs,
        profile="node",
        registry={
            "npm_registry": "npm.mirror.example",
            "npm_registry_url": "https://npm.mirror.example/npm/",
        }.get,
    )
    assert spec.net == "allowlist"
    assert spec.allow_hosts == ["npm.mirror.example"]
    assert (spec.memory, spec.pids) == (4 << 30, 1024)
    # the sandboxed npm is told the registry the allowlist names (it cannot read ~/.npmrc)
    assert spec.env["npm_config_registry"] == "https://npm.mirror.example/npm/"
    assert "npm_config_cafile" not in spec.env  # none configured: npm's default
    spec = build(fs, profile="python", registry={"pip_index": "pypi.mirror.example"}.get)
    assert spec.allow_hosts == ["pypi.mirror.example"]
    assert [n for n in spec.notes if "dropped" in n] == [
        "profile python: allow_hosts {pip_files}: no {pip_files} configured; dropped"
    ]
    assert "PIP_INDEX_URL" not in spec.env
    # nothing at all to allow: an error naming the cause and the flag, never an empty allowlist
    with pytest.raises(
        UsageError,
        match=r"profile python: no host to allow: \{pip_index\}, "
        r"\{pip_files\} could not be read .* --allow-host HOST",
    ):
        build(fs, profile="python", registry=lambda name: None)
    assert build(
        fs, profile="python", registry=lambda name: None, allow_host=["pypi.mirror.example"]
    ).allow_hosts == ["pypi.mirror.example"]


def test_profile_hosts_unused_with_public(fs: Fs) -> None:
    spec = build(fs, profile="node", net="public")
    assert spec.net == "public" and spec.allow_hosts == []
    assert any("allow_hosts not used with --net public" in n for n in spec.notes)


def test_dedupe_hosts_ports_cidrs(fs: Fs) -> None:
    spec = build(
        fs,
        allow_host=["a.example", "A.example."],
        allow_port=[443, 443, 22],
        allow_cidr=["192.168.4.0/24", "192.168.4.0/24"],
    )
    assert spec.allow_hosts == ["a.example"]
    assert spec.allow_ports == [443, 22]
    assert spec.allow_cidrs == ["192.168.4.0/24"]


@pytest.mark.parametrize(
    "options,message",
    [
        (
            {"net": "public", "allow_host": ["a.example"]},
            "--allow-host: cannot be combined with --net public",
        ),
        (
            {"net": "none", "allow_host": ["a.example"]},
            "--allow-host: cannot be combined with --net none",
        ),
        ({"net": "none", "pcap": "x.pcap"}, "--pcap: cannot be combined with --net none"),
        ({"profile": "offline", "pcap": "x.pcap"}, "--pcap: cannot be combined with --net none"),
        (
            {"profile": "offline", "tailscale": True},
            "--tailscale: cannot be combined with --net none",
        ),
        ({"net": "none", "allow_port": [22]}, "--allow-port: cannot be combined"),
        ({"net": "none", "allow_cidr": ["192.168.0.0/16"]}, "--allow-cidr: cannot be combined"),
        ({"allow_cidr": ["0.0.0.0/0"]}, "every address"),
        ({"allow_cidr": ["10.0.0.0/8"]}, "overlaps the sandbox's own network"),
        ({"allow_host": ["1.2.3.4:"]}, "no port after"),
        ({"allow_port": [0]}, "--allow-port: 0 is not a port number"),
        ({"pcap_max": 100}, "--pcap-max: needs --pcap"),
        (
            {"audit_log": "/no/such/dir/a.json"},
            "--audit-log /no/such/dir/a.json: /no/such/dir is not a directory",
        ),
        ({"net": "offline"}, "options.net: expected public, allowlist or none"),
        ({"seccomp": "loose"}, "options.seccomp: expected strict or compat"),
        ({"memory": "2GiB"}, "options.memory: expected a size in bytes"),
        ({"memory": 0}, "options.memory: expected a size in bytes"),
        ({"pids": True}, "options.pids: expected a positive whole number"),
        ({"ro": "/usr"}, "options.ro: expected a list of strings"),
        ({"tty": "yes"}, "options.tty: expected true or false"),
        ({"tty_raw": 1}, "options.tty_raw: expected true or false"),
        ({"bogus": 1}, "unknown option 'bogus'"),
        ({"env": [{"name": "1X", "value": "v", "present": True}]}, "not a valid variable name"),
        ({"env": [{"name": "A", "value": 3, "present": True}]}, "options.env: expected"),
        ({"profile": "nope"}, "unknown profile 'nope'"),
    ],
)
def test_refusals(fs: Fs, options: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build(fs, **options)


def test_limits_flags_override_profile(fs: Fs) -> None:
    spec = build(
        fs,
        profile="node",
        memory=1 << 30,
        pids=64,
        cpus=1.5,
        timeout=60.0,
        registry={"npm_registry": "npm.mirror.example"}.get,
    )
    assert (spec.memory, spec.pids, spec.cpus, spec.timeout) == (1 << 30, 64, 1.5, 60.0)


def test_logs_made_absolute(fs: Fs) -> None:
    spec = build(
        fs,
        net_log="net.json",
        pcap="c.pcap",
        pcap_max=1000,
        audit_log="/tmp/a.json",
        seccomp="compat",
    )
    assert spec.net_log == fs["wd"] + "/net.json"
    assert spec.pcap == fs["wd"] + "/c.pcap"
    assert (spec.pcap_max, spec.audit_log, spec.seccomp) == (1000, "/tmp/a.json", "compat")


def test_bools(fs: Fs) -> None:
    spec = build(fs, tty=True, verbose=True, allow_git_write=True, tailscale=True)
    assert spec.tty and spec.verbose and spec.allow_git_write and spec.tailscale


def test_tty_raw_from_the_flag_or_the_profile_and_said_under_v(fs: Fs) -> None:
    assert not build(fs).tty_raw
    assert not any("unfiltered" in n for n in build(fs).notes)
    spec = build(fs, tty_raw=True)
    assert spec.tty_raw
    assert (
        "--tty-raw: the payload's output reaches the terminal unfiltered (clipboard writes "
        "and queries included)" in spec.notes
    )
    prof = profile_file(fs, "tty_raw: true\n")
    spec = build(fs, profile=prof)
    assert spec.tty_raw and any(n.startswith(f"profile {prof}: tty_raw: ") for n in spec.notes)
    assert build(fs, detach=True, tty_raw=True).tty_raw  # harmless without a terminal


def test_an_unapproved_project_cannot_unfilter_the_terminal(
    fs: Fs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The payload can write .boxy.yaml: tty_raw in it is a widening, held back."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(fs["tmp"] / "config"))
    with open(os.path.join(fs["wd"], ".boxy.yaml"), "w") as f:
        f.write("tty_raw: true\n")
    spec = build(fs)
    assert not spec.tty_raw
    assert "not approved, so held back: tty_raw of" in spec.warnings[0]


def test_detach(fs: Fs) -> None:
    assert build(fs, detach=True).detach
    with pytest.raises(UsageError, match="--tty: cannot be combined with -d"):
        build(fs, detach=True, tty=True)


def test_env(fs: Fs) -> None:
    client = {"TERM": "xterm", "GITHUB_TOKEN": "t", "SSH_AUTH_SOCK": "/nowhere/agent"}
    spec = build(
        fs,
        client_env=client,
        env=[
            {"name": "GITHUB_TOKEN", "value": "t", "present": True},
            {"name": "MISSING", "value": None, "present": False},
            {"name": "SSH_AUTH_SOCK", "value": None, "present": False},
            {"name": "A", "value": "b", "present": True},
        ],
    )
    assert spec.env["GITHUB_TOKEN"] == "t"
    assert spec.env["A"] == "b"
    assert spec.env["TERM"] == "xterm"
    assert "MISSING" not in spec.env
    # present: false is not filled from client_env, which only feeds the exposure check
    assert "SSH_AUTH_SOCK" not in spec.env
    # said without -v: a typo would otherwise pass unnoticed
    assert sum("not set in your environment, so not passed" in n for n in spec.warnings) == 2


def test_exposure_checked_for_workdir_and_flags(fs: Fs) -> None:
    with pytest.raises(
        UsageError, match=r"workdir .*/home: is your home directory .*/home, whose keys"
    ):
        build(fs, workdir=fs["home"])
    sock_dir = fs["home"] + "/data"
    os.makedirs(sock_dir, exist_ok=True)
    agent = socket.socket(socket.AF_UNIX)
    agent.bind(sock_dir + "/agent")  # only a path that exists is ever named
    with pytest.raises(
        UsageError, match=r"--ro .*/data: exposes .*/data/agent \(SSH agent socket\)"
    ):
        build(fs, ro=[sock_dir], client_env={"SSH_AUTH_SOCK": sock_dir + "/agent"})
    agent.close()
    with pytest.raises(UsageError, match="--ro /: holds your home directory"):
        build(fs, ro=["/"])


def test_from_the_command_line(fs: Fs) -> None:
    """boxyctl.cli's Run parameters are exactly what build_spec takes."""
    home = fs["home"]
    cmd = parse(
        ["run", "-p", "node", "--ro", "~/data", "--allow-host", "github.com:443", "-e", "X=1",
         "--memory", "1GiB", "--timeout", "10m", "--copy", "~/file.txt:/opt/f", "--", "npm", "ci"],
        environ={"HOME": home, "TERM": "dumb"},
        cwd=fs["wd"],
    )  # fmt: skip
    spec = build_spec(
        cmd.args["request"], uid=os.getuid(), user="u", home=home, registry=lambda n: None
    )
    assert spec.argv == ["npm", "ci"]
    assert spec.ro == [PathEntry(home + "/data")]
    assert spec.allow_hosts == ["github.com:443"]
    assert spec.env["X"] == "1" and spec.env["TERM"] == "dumb"
    assert (spec.memory, spec.timeout) == (1 << 30, 600.0)
    assert spec.copy == [CopyEntry(home + "/file.txt", "/opt/f")]


def test_exposure_message_names_the_profile(fs: Fs) -> None:
    path = profile_file(fs, "filesystem:\n  ro: ['{home}']\n")
    with pytest.raises(
        UsageError, match=f"profile {path}: filesystem.ro .*/home: is your home directory"
    ):
        build(fs, profile=path)


def test_allow_port_with_public_is_refused_by_the_daemon_too(fs: Fs) -> None:
    # the profile may make it public (generic) when the client did not say --net
    with pytest.raises(UsageError, match="cannot be combined with --net public"):
        build(fs, allow_port=[22])


def test_net_log_with_the_offline_profile_is_refused(fs: Fs) -> None:
    # the profile, not a flag, made it --net none: the daemon refuses what the client could not
    with pytest.raises(UsageError, match="--net-log: cannot be combined with --net none"):
        build(fs, profile="offline", net_log=fs["wd"] + "/n.json")


def test_profile_network_keys_tty_and_tmpfs(fs: Fs) -> None:
    prof = profile_file(
        fs,
        "net: allowlist\nallow_hosts: [example.org]\n"
        "allow_cidr: [192.168.4.0/24]\ntailscale: true\ntty: true\n"
        "filesystem: {tmpfs: ['{home}/.cache/tool', /opt/scratch]}\n",
    )
    spec = build(fs, profile=prof, allow_cidr=["10.9.0.0/16"])
    assert spec.allow_cidrs == ["192.168.4.0/24", "10.9.0.0/16"]
    assert spec.tailscale and spec.tty
    assert spec.tmpfs == [fs["home"] + "/.cache/tool", "/opt/scratch"]
    offline = build(fs, profile=prof, net="none")  # nothing to apply them to: said, not used
    assert offline.allow_cidrs == [] and not offline.tailscale
    assert f"profile {prof}: allow_cidr not used with --net none" in offline.notes


@pytest.mark.parametrize("path, message", [
    ("/usr/local/x", "overlaps /usr, which is bound in"),
    ("{workdir}/build", "overlaps {wd}, which is bound in"),
    ("/", "not /"),
    ("/tmp", "already a fresh tmpfs"),
    ("{home}", "already a fresh tmpfs"),
])  # fmt: skip
def test_profile_tmpfs_refused(fs: Fs, path: str, message: str) -> None:
    prof = profile_file(fs, f"filesystem: {{tmpfs: ['{path}']}}\n")
    with pytest.raises(ProfileError) as e:
        build(fs, profile=prof)
    assert message.format(wd=fs["wd"]) in str(e.value)


def test_profile_secrets_are_asked_of_the_client_by_name(fs: Fs) -> None:
    prof = profile_file(fs, "env_secrets: [API_TOKEN, OTHER]\n")
    with pytest.raises(SecretsNeeded) as e:
        build(fs, profile=prof, secret=[{"name": "OTHER", "value": "s3cr3t-other"}])
    assert e.value.names == ["API_TOKEN"] and "s3cr3t" not in str(e.value)
    spec = build(
        fs,
        profile=prof,
        secret=[
            {"name": "API_TOKEN", "value": "s3cr3t-tok"},
            {"name": "OTHER", "value": "s3cr3t-other"},
        ],
    )
    assert spec.env["API_TOKEN"] == "s3cr3t-tok" and spec.env["OTHER"] == "s3cr3t-other"


def test_a_presets_tools_file_planted_as_a_symlink_is_refused_with_what_to_do(
    tmp_path: Path,
) -> None:
    """The node preset pins .github read-only; a payload that made it a symlink must not
    get an unpinned .github (refused), and the line says what to do about it. (A held
    file planted as a symlink is the held files' own: test_heldfiles.py.)"""
    import pwd

    from boxy.errors import UsageError
    from boxy.request import RunOptions, RunRequest
    from boxyd.config.spec import build_spec

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".github").symlink_to(tmp_path / "elsewhere")
    pw = pwd.getpwuid(os.getuid())
    req = RunRequest(["true"], str(tmp_path), RunOptions(profile="node", net="none"))
    with pytest.raises(UsageError, match=r"\.github is a symlink, which cannot be made read-only"):
        build_spec(req, uid=os.getuid(), user=pw.pw_name, home=pw.pw_dir, registry=lambda n: None)
