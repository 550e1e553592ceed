"""boxyd.config.profiles (with profileschema and profilemerge): presets, strict validation
with file/key/expected, extends, templates."""

import os
import time
from pathlib import Path

import pytest
import yaml

from boxy import options
from boxy.errors import ProfileError
from boxyd.config import profiles, profileschema, profileview
from boxyd.config.profiles import list_profiles, load_profile, resolve_hosts
from boxyd.config.profileschema import HOST_TEMPLATES, Profile, workdir_slug
from boxyd.config.runspec import CopyEntry, PathEntry

CTX = {"workdir": "/home/u/p", "home": "/home/u"}
PRESETS = ["claude", "generic", "node", "offline", "python"]


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def load(tmp_path: Path, text: str) -> Profile:
    return load_profile(write(tmp_path, text), context=CTX)


def test_list_profiles() -> None:
    """The files, and the list the client names them by (boxy.options.PRESETS)."""
    assert list_profiles() == PRESETS == sorted(options.PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_presets_load_and_say_what_they_are_for(name: str) -> None:
    profile = load_profile(name, context=CTX)
    assert profile.description
    assert profile.source == name
    assert (profiles._preset_dir() / f"{name}.yaml").read_text().startswith(f"# {name}:")


def test_generic_and_offline() -> None:
    assert load_profile("generic", context=CTX).net == "public"
    assert load_profile("offline", context=CTX).net == "none"


@pytest.mark.parametrize("name", ["node", "python"])
def test_registry_presets_name_no_host(name: str) -> None:
    """Registry hosts come from the tool's configuration, never the preset."""
    profile = load_profile(name, context=CTX)
    assert profile.net == "allowlist"
    assert profile.allow_hosts
    for host in profile.allow_hosts:
        assert host.startswith("{") and host.strip("{}") in HOST_TEMPLATES


def test_node_preset() -> None:
    p = load_profile("node", context={**CTX, "cache": "/c/node/p"})
    assert p.env == {
        "NPM_CONFIG_UPDATE_NOTIFIER": "false",
        "npm_config_registry": "{npm_registry_url}",
        "npm_config_cafile": "{npm_cafile}",
        "NODE_OPTIONS": "--use-openssl-ca",
        "SSL_CERT_FILE": "{npm_cafile}",
        "npm_config_cache": "/c/node/p/npm",
        "YARN_CACHE_FOLDER": "/c/node/p/yarn",
        "PNPM_HOME": "/c/node/p/pnpm",  # pnpm's store: $PNPM_HOME/store
    }  # npm's, yarn's, pnpm's: this project's
    # every npm_config_* is one npm knows: npm warns of any other on every command
    # ('npm warn Unknown env config "store-dir"')
    npm_keys = {"registry", "cafile", "cache", "update_notifier"}
    assert {
        k.lower().removeprefix("npm_config_") for k in p.env if k.lower().startswith("npm_config_")
    } <= npm_keys
    assert (p.memory, p.pids) == (4 << 30, 1024)
    assert not (p.ro or p.rw or p.copy)  # no ~/.npmrc (it may hold tokens), no host cache
    assert [e.path for e in p.mkdir] == ["/c/node/p"]  # boxy's own cache for this project


def test_python_preset() -> None:
    p = load_profile("python", context={**CTX, "cache": "/c/python/p"})
    assert p.allow_hosts == ["{pip_index}", "{pip_files}"]
    assert p.env == {
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_INDEX_URL": "{pip_index_url}",
        "PIP_CERT": "{pip_cert}",
        "PIP_CACHE_DIR": "/c/python/p/pip",
    }


def test_claude_preset() -> None:
    p = load_profile("claude", context=CTX)
    assert p.net == "allowlist"
    literal = [h for h in p.allow_hosts if not h.startswith("{")]
    assert literal and all(h.endswith((".anthropic.com", "claude.ai")) for h in literal)
    assert "{go_proxy}" in p.allow_hosts and "{go_sumdb}" in p.allow_hosts
    assert p.ro == [PathEntry("/home/u/.local/bin/claude", True)]
    assert p.mkdir == [PathEntry("/home/u/.claude/projects/-home-u-p")]
    assert p.copy == [
        CopyEntry("/home/u/.claude/.credentials.json", "/home/u/.claude/.credentials.json", True),
        CopyEntry("/home/u/.config/boxy/claude-mcp.json", "/home/u/.claude.json", True),
    ]
    assert p.copy_ro == [CopyEntry("/home/u/.claude/CLAUDE.md", "/home/u/.claude/CLAUDE.md", True)]
    assert not p.rw


@pytest.mark.parametrize(
    "workdir,slug",
    [("/home/u/p", "-home-u-p"), ("/", "-"), ("/a/b.c/d_e", "-a-b-c-d-e"), ("/x/../y", "-x----y")],
)
def test_workdir_slug(workdir: str, slug: str) -> None:
    assert workdir_slug(workdir) == slug
    assert "/" not in slug and ".." not in slug


def test_unknown_preset() -> None:
    with pytest.raises(ProfileError, match="unknown profile 'nope' .presets: claude, generic"):
        load_profile("nope", context=CTX)


def test_missing_file() -> None:
    with pytest.raises(ProfileError, match="profile /no/such.yaml: no such file"):
        load_profile("/no/such.yaml", context=CTX)


def test_full_schema(tmp_path: Path) -> None:
    p = load(
        tmp_path,
        """
description: everything
net: allowlist
allow_hosts: [a.example, "b.example:22", "c.example:53/udp", "{npm_registry}"]
allow_ports: [8080]
filesystem:
  ro: [/usr/share/dict, {path: "~/.gitconfig", optional: true}]
  rw: ["{workdir}/../shared"]
  mkdir: ["~/.cache/x-{workdir_slug}"]
  protect: ["{workdir}/.env"]
  copy: ["~/a.json:{home}/b.json", {src: /etc/hostname, optional: false}]
  copy_ro: [{src: ~/c, dst: /opt/c}]
env: {A: "1", B: x}
env_pass: [EDITOR]
limits: {memory: 1GiB, pids: 100, cpus: 1.5, timeout: 10m}
seccomp: compat
""",
    )
    assert p.description == "everything"
    assert p.allow_hosts == ["a.example", "b.example:22", "c.example:53/udp", "{npm_registry}"]
    assert p.allow_ports == [8080]
    assert p.ro == [PathEntry("/usr/share/dict"), PathEntry("/home/u/.gitconfig", True)]
    assert p.rw == [PathEntry("/home/u/shared")]
    assert p.mkdir == [PathEntry("/home/u/.cache/x--home-u-p")]
    assert p.protect == [PathEntry("/home/u/p/.env")]
    assert p.copy == [
        CopyEntry("/home/u/a.json", "/home/u/b.json"),
        CopyEntry("/etc/hostname", "/etc/hostname"),
    ]
    assert p.copy_ro == [CopyEntry("/home/u/c", "/opt/c")]
    assert p.env == {"A": "1", "B": "x"}
    assert p.env_pass == ["EDITOR"]
    assert (p.memory, p.pids, p.cpus, p.timeout) == (1 << 30, 100, 1.5, 600.0)
    assert p.seccomp == "compat"


def test_empty_file_is_an_empty_profile(tmp_path: Path) -> None:
    p = load(tmp_path, "# nothing\n")
    assert p.net is None and not p.allow_hosts


def error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ProfileError) as e:
        load_profile(path, context=CTX)
    message = str(e.value)
    assert message.startswith(f"profile {path}: ")
    assert "\n" not in message
    return message[len(f"profile {path}: ") :]


def test_unknown_top_key(tmp_path: Path) -> None:
    assert error(tmp_path, "filesytem: {}\n") == (
        "unknown key 'filesytem' (expected one of: description, extends, net, allow_hosts, "
        "allow_ports, allow_cidr, tailscale, ask, ask_timeout, ask_notify, ports, filesystem, review, env, env_pass, "
        "env_secrets, limits, seccomp, tty, tty_raw)"
    )


def test_unknown_nested_keys(tmp_path: Path) -> None:
    assert error(tmp_path, "filesystem: {rox: []}").startswith(
        "unknown key 'filesystem.rox' (expected one of: ro, rw, mkdir"
    )
    assert "unknown key 'limits.mem'" in error(tmp_path, "limits: {mem: 1G}")
    assert "unknown key 'filesystem.ro[0].opt'" in error(
        tmp_path, "filesystem: {ro: [{path: /x, opt: true}]}"
    )


def test_wrong_path_entry_type(tmp_path: Path) -> None:
    assert error(tmp_path, "filesystem:\n  ro: [/a, /b, 3]\n") == (
        "key filesystem.ro[2]: expected a path string or {path:, optional:}"
    )


@pytest.mark.parametrize(
    "text,expected",
    [
        ("net: offline", "key net: expected one of: public, allowlist, none"),
        ("net: off", "key net: expected one of"),  # YAML 1.1 reads 'off' as false
        ("seccomp: loose", "key seccomp: expected one of: strict, compat"),
        ("description: 3", "key description: expected a string"),
        ("allow_hosts: a.example", "key allow_hosts: expected a list"),
        ("allow_hosts: [3]", "key allow_hosts[0]: expected a host name string"),
        ("allow_hosts: ['1.2.3.4:']", "allow_hosts[0]: '1.2.3.4:': no port"),
        ("allow_hosts: ['{npm}']", "key allow_hosts[0]: unknown template {npm}"),
        ("allow_ports: [0]", "key allow_ports[0]: expected a port number"),
        ("allow_ports: ['443']", "key allow_ports[0]: expected a port number"),
        ("allow_ports: [true]", "key allow_ports[0]: expected a port number"),
        ("filesystem: []", "key filesystem: expected a mapping"),
        (
            "filesystem: {ro: [relative/x]}",
            "key filesystem.ro[0]: 'relative/x' is not an absolute path",
        ),
        ("filesystem: {ro: ['{workdri}/x']}", "key filesystem.ro[0]: unknown template {workdri}"),
        (
            "filesystem: {ro: [{path: /x, optional: maybe}]}",
            "key filesystem.ro[0].optional: expected true or false",
        ),
        ("filesystem: {ro: [{optional: true}]}", "key filesystem.ro[0]: expected a path string"),
        ("filesystem: {copy: [3]}", "key filesystem.copy[0]: expected 'SRC[:DST]'"),
        ("filesystem: {copy: ['/a:']}", "key filesystem.copy[0]: expected 'SRC[:DST]'"),
        (
            "filesystem: {copy: [{src: /a, dst: 3}]}",
            "key filesystem.copy[0].dst: expected 'SRC[:DST]'",
        ),
        ("filesystem: {copy: ['/a:rel']}", "key filesystem.copy[0]: 'rel' is not an absolute path"),
        ("env: [A]", "key env: expected a mapping"),
        ("env: {A: 1}", "key env.A: expected a string (quote true/false and numbers)"),
        ("env: {A: false}", "key env.A: expected a string"),
        ("env: {1A: x}", "env '1A': not a valid variable name"),
        ("env_pass: [A-B]", "env_pass[0] 'A-B': not a valid variable name"),
        ("limits: {memory: 2XB}", "key limits.memory: '2XB' is not a size"),
        ("limits: {memory: -1}", "key limits.memory: expected a size"),
        ("limits: {pids: 0}", "key limits.pids: expected a positive whole number"),
        ("limits: {pids: 1.5}", "key limits.pids: expected a positive whole number"),
        ("limits: {cpus: 0}", "key limits.cpus: expected a positive number"),
        ("limits: {timeout: forever}", "key limits.timeout: 'forever' is not a duration"),
        ("limits: 5", "key limits: expected a mapping"),
        ("extends: 3", "key extends: expected a profile name or path"),
        ("- a\n- b", "expected a mapping of keys at the top level"),
    ],
)
def test_wrong_values(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error(tmp_path, text)


def test_invalid_yaml_names_line_and_column(tmp_path: Path) -> None:
    message = error(tmp_path, "net: public\nfilesystem:\n  ro: [/a\n  rw: x\n")
    assert message.startswith("invalid YAML at line ")
    assert "column" in message


def test_invalid_yaml_position(tmp_path: Path) -> None:
    message = error(tmp_path, "net: public\nenv: {A: 'x}\n")
    assert message.startswith("invalid YAML at line 3 column 1: ")


def test_duplicate_key_refused(tmp_path: Path) -> None:
    assert error(tmp_path, "net: none\nnet: public\n") == (
        "invalid YAML at line 2 column 1: duplicate key 'net'"
    )


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_bytes(b"net: \xff\n")
    with pytest.raises(ProfileError, match="not UTF-8"):
        load_profile(str(path), context=CTX)


def test_extends_preset(tmp_path: Path) -> None:
    p = load(
        tmp_path,
        "extends: node\nallow_hosts: [github.com]\nenv: {A: b}\nlimits: {pids: 2000}\n",
    )
    assert p.net == "allowlist"
    assert p.allow_hosts == ["{npm_registry}", "github.com"]
    assert p.env["A"] == "b" and p.env["NPM_CONFIG_UPDATE_NOTIFIER"] == "false"
    assert p.env["npm_config_registry"] == "{npm_registry_url}"  # inherited, unresolved
    assert (p.memory, p.pids) == (4 << 30, 2000)
    assert p.description  # inherited


def test_extends_relative_file(tmp_path: Path) -> None:
    write(tmp_path, "net: none\nfilesystem: {ro: [/base]}\n", "base.yaml")
    p = load(tmp_path, "extends: ./base.yaml\nfilesystem: {ro: [/child]}\n")
    assert p.net == "none"
    assert [e.path for e in p.ro] == ["/base", "/child"]


def test_extends_one_level_only(tmp_path: Path) -> None:
    write(tmp_path, "extends: node\n", "base.yaml")
    assert "only one level" in error(tmp_path, "extends: ./base.yaml\n")


def test_extends_base_errors_name_the_base(tmp_path: Path) -> None:
    base = write(tmp_path, "nett: none\n", "base.yaml")
    path = write(tmp_path, "extends: ./base.yaml\n")
    with pytest.raises(ProfileError, match=f"profile {base}: unknown key 'nett'"):
        load_profile(path, context=CTX)


def test_resolve_hosts() -> None:
    notes: list[str] = []
    table = {"npm_registry": "registry.internal.example", "pip_index": "not a host!"}
    hosts = resolve_hosts(
        ["a.example:22", "{npm_registry}", "{npm_registry}:8443", "{pip_index}", "{pip_files}"],
        table.get,
        source="x",
        notes=notes,
    )
    assert hosts == ["a.example:22", "registry.internal.example", "registry.internal.example:8443"]
    assert len(notes) == 2
    assert "{pip_index}" in notes[0] and "dropped" in notes[0]
    assert "no {pip_files} configured; dropped" in notes[1]


def test_resolve_hosts_without_resolver() -> None:
    notes: list[str] = []
    assert resolve_hosts(["{go_proxy}", "b.example"], None, source="x", notes=notes) == [
        "b.example"
    ]
    assert notes == ["profile x: allow_hosts {go_proxy}: no {go_proxy} configured; dropped"]


def test_env_templates_filled_from_the_tools_or_left_out() -> None:
    from boxyd.config.profiles import resolve_env

    notes: list[str] = []
    got = resolve_env(
        {"A": "{npm_registry_url}", "B": "{pip_cert}", "C": "plain"},
        {"npm_registry_url": "https://m.example.test/"}.get,
        source="p",
        notes=notes,
    )
    assert got == {"A": "https://m.example.test/", "C": "plain"}
    assert notes == ["profile p: env B: no {pip_cert} configured; not set"]


def test_unknown_env_template_is_refused(tmp_path: Path) -> None:
    from boxyd.config.profiles import load_profile

    f = tmp_path / "p.yaml"
    f.write_text('env:\n  X: "{secret_sauce}"\n')
    with pytest.raises(ProfileError, match=r"env\.X.*unknown template \{secret_sauce\}"):
        load_profile(str(f), context={"workdir": "/w", "home": "/h"})


def test_user_profiles_are_looked_up_before_the_presets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NAME: a path, then $XDG_CONFIG_HOME/boxy/profiles/NAME.yaml, then the preset."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    d = tmp_path / "boxy" / "profiles"
    d.mkdir(parents=True)
    (d / "mine.yaml").write_text("description: mine\nnet: none\n")
    (d / "node.yaml").write_text("description: my node\nextends: node\n")
    assert profiles.where("mine") == ("user", str(d / "mine.yaml"))
    assert load_profile("mine", context=CTX).description == "mine"
    assert load_profile("node", context=CTX).description == "my node"  # shadows the preset
    assert load_profile("node", context=CTX).allow_hosts == ["{npm_registry}"]  # merged
    assert profiles.where("python") == ("preset", "python")
    with pytest.raises(
        ProfileError, match=r"unknown profile 'nope' .*your own under .*/boxy/profiles/NAME.yaml"
    ):
        profiles.where("nope")


def test_a_fifo_or_a_non_profile_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ProfileError, match="not a regular file"):
        load_profile(str(fifo), context=CTX)
    with pytest.raises(ProfileError, match="expected a mapping"):
        load_profile("/etc/passwd", context=CTX)


@pytest.mark.parametrize("text, message", [
    ("allow_cidr: 10.1.0.0/16", "key allow_cidr: expected a list"),
    ("allow_cidr: [7]", "key allow_cidr[0]: expected an address range such as 192.168.4.0/24"),
    ("allow_cidr: [0.0.0.0/0]", "would permit every address"),
    ("allow_cidr: [10.0.2.0/24]", "overlaps the sandbox's own network"),
    ("tailscale: yes please", "key tailscale: expected true or false"),
    ("tty: 1", "key tty: expected true or false"),
    ("tty_raw: yes please", "key tty_raw: expected true or false"),
    ("env_secrets: TOKEN", "key env_secrets: expected a list"),
    ("env_secrets: [1BAD]", "env_secrets[0]"),
    ("env_secrets: ['GH@not a host']", "key env_secrets[0]: --secret GH@not a host: not a host: not a host name"),
    ("env_secrets: ['GH@']", "key env_secrets[0]: --secret GH@: a host name is missing"),
    ("env_secrets: ['1BAD@a.example']", "key env_secrets[0]: env_secrets[0] '1BAD': not a valid variable name"),
    ("filesystem: {tmpfs: [relative/dir]}", "key filesystem.tmpfs[0]: 'relative/dir' is not an absolute path"),
    ("filesystem: {tmpfs: [7]}", "key filesystem.tmpfs[0]: expected a path"),
    ("filesystem: {tmpfs: ['{nope}']}", "key filesystem.tmpfs[0]: unknown template {nope}"),
    ("filesystem: {secrets: '*.key'}", "key filesystem.secrets: expected a list"),
    ("filesystem: {secrets: [7]}", "key filesystem.secrets[0]: expected a glob string"),
    ("filesystem: {secrets: ['/etc/x']}", "key filesystem.secrets[0]: '/etc/x': expected a glob relative"),
    ("filesystem: {secrets: ['../x']}", "key filesystem.secrets[0]: '../x': expected a glob relative"),
    ("filesystem: {secrets: ['a//b']}", "key filesystem.secrets[0]: 'a//b': expected a glob relative"),
])  # fmt: skip
def test_new_keys_refused_with_one_line(tmp_path: Path, text: str, message: str) -> None:
    assert message in error(tmp_path, text + "\n")


def test_new_keys_read_and_merged(tmp_path: Path) -> None:
    base = write(
        tmp_path,
        "allow_cidr: [192.168.4.0/24]\nenv_secrets: [A]\ntailscale: true\n"
        "filesystem: {tmpfs: ['{home}/.cache/x']}\n",
        name="base.yaml",
    )
    child = write(
        tmp_path,
        f"extends: {base}\nallow_cidr: ['192.168.4.0/24,fd12::/48']\n"
        "env_secrets: [A, 'B@API.Example.', 'C@a.example,b.example']\ntty: true\ntty_raw: true\n"
        "filesystem: {tmpfs: [/opt/scratch]}\n",
        name="child.yaml",
    )
    p = load_profile(child, context=CTX)
    assert p.allow_cidrs == ["192.168.4.0/24", "fd12::/48"]
    assert p.env_secrets == ["A", "B@api.example", "C@a.example,b.example"]
    assert p.tailscale is True and p.tty is True
    assert p.tty_raw is True
    assert p.tmpfs == [CTX["home"] + "/.cache/x", "/opt/scratch"]


# --- what the payload can write: .boxy.yaml is read with the same loader ----------------

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(6)
)


def project_error(text: str) -> str:
    with pytest.raises(ProfileError) as e:
        profiles.project_doc(text, "/w/.boxy.yaml")
    message = str(e.value)
    assert message.startswith("profile /w/.boxy.yaml: invalid YAML") and "\n" not in message
    return message


@pytest.mark.parametrize("text, message", [
    ("x: !!int y\n", "line 1 column 4: cannot read int 'y'"),
    ("a: !!float x\n", "line 1 column 4: cannot read float 'x'"),
    ("a: 2001-13-45\n", "line 1 column 4: cannot read timestamp '2001-13-45'"),
    ("a: " + "1" * 5000 + "\n", "line 1 column 4: cannot read int '1111"),
    ("? [a]\n: 1\n", "line 1 column 3: a key that is a list or mapping"),
    ("env: " + "[" * 3000, "line 1 column 38: nested deeper than 32 levels"),
    ("env:\n" + "- " * 3000 + "x\n", "nested deeper than 32 levels"),
    ("net: &n public\n", "line 1 column 6: anchors and aliases (&, *) are not allowed in a project file"),
    ("net: *n\n", "line 1 column 6: anchors and aliases"),
    (BOMB, "line 1 column 4: anchors and aliases"),
    ("a: \x00\n", "unacceptable character #x0000"),
])  # fmt: skip
def test_project_file_values_that_break_pyyaml_are_one_line(text: str, message: str) -> None:
    """The issue's reproductions: each was a ValueError, TypeError or RecursionError
    out of PyYAML ("internal error" for every later run)."""
    assert message in project_error(text)


def test_deep_nesting_is_refused_before_pyyaml_scans_it() -> None:
    """'[' * N used to cost PyYAML's scanner O(N²) before a RecursionError."""
    t0 = time.process_time()
    project_error("env: " + "[" * 60000)
    assert time.process_time() - t0 < 1.0  # 0.8 s for 3,000 before; now it stops at 33


def test_user_profile_may_use_aliases_within_a_bound(tmp_path: Path) -> None:
    p = load(tmp_path, "description: &h shared\nenv: {A: *h}\n")
    assert p.env == {"A": "shared"} and p.description == "shared"
    message = error(tmp_path, BOMB)  # 9⁷ values once expanded
    assert "more than 100000 values once its aliases are expanded" in message
    assert "anchors" not in message


def test_user_profile_alias_to_its_own_container_is_refused(tmp_path: Path) -> None:
    assert "alias *a refers to a value that contains it" in error(tmp_path, "env: &a {A: *a}\n")


def test_nesting_depth_32_is_fine() -> None:
    assert profiles.project_doc("description: " + "[" * 31 + "]" * 31 + "\n", "x")["description"]


YAML_SEEDS = [
    b"profile: node\nnet: allowlist\nallow_hosts: [a.example, '{npm_registry}']\n",
    b"filesystem:\n  ro:\n    - ~/.gitconfig\n    - {path: /opt/x, optional: true}\n"
    b"  copy: ['~/.npmrc:/tmp/npmrc']\nlimits: {memory: 2GiB, pids: 100, timeout: 10m}\n",
    b"env: {A: 'x', B: \"y\\u0041\"}\nenv_pass: [TERM]\ntty: true\nseccomp: compat\n",
    b"description: >\n  folded\n  text\n? complex\n: 1\n",
]
YAML_TOKENS = [
    b"[",
    b"{",
    b"]",
    b"}",
    b"- ",
    b"? ",
    b": ",
    b"&a ",
    b"*a",
    b"!!int ",
    b"!!float ",
    b"!!timestamp ",
    b"!!binary ",
    b"!!set ",
    b"<<: ",
    b"\n  ",
    b"'",
    b'"',
    b"\\",
    b"#",
    b"%YAML 1.1\n",
    b"---\n",
    b"1",
    b"2001-13-45",
    b"\t",
    b"\xef\xbb\xbf",
    b"|\n",
]


def test_fuzz_project_yaml_only_ever_profile_error() -> None:
    from tests.unit.parserfuzz import mutations

    for data in mutations(YAML_SEEDS, YAML_TOKENS, seed=1):
        text = data.decode(errors="replace")
        for loader in (profiles._StrictLoader, profiles._ProjectLoader):
            try:
                profiles._parse_yaml("fuzz", text, loader)
            except ProfileError as e:
                assert "\n" not in str(e)


def test_yaml_size_sweep_is_linear() -> None:
    from tests.unit.parserfuzz import assert_linear

    def hosts(n: int) -> str:
        return "allow_hosts:\n" + "".join(f"  - h{i}.example   # a comment\n" for i in range(n))

    assert_linear(hosts, lambda t: profiles.project_doc(t, "x"), 200)
    assert_linear(
        lambda n: "description: " + "word " * n + "\n", lambda t: profiles.project_doc(t, "x"), 500
    )
    assert_linear(
        lambda n: "env: [" + "[[[]]], " * n + "]\n", lambda t: profiles.project_doc(t, "x"), 100
    )


def test_secrets_patterns_load_and_merge(tmp_path: Path) -> None:
    p = load(tmp_path, "filesystem:\n  secrets: ['*.secret', 'conf/prod/*.yaml', 'vault/']\n")
    assert p.secrets == ["*.secret", "conf/prod/*.yaml", "vault"]
    base = write(tmp_path, "filesystem: {secrets: ['*.secret']}\n", "base.yaml")
    child = load(tmp_path, f"extends: {base}\nfilesystem: {{secrets: ['*.secret', '*.tok']}}\n")
    assert child.secrets == ["*.secret", "*.tok"]


@pytest.mark.parametrize("name", ["node", "python"])
def test_install_presets_protect_the_ci_files(name: str) -> None:
    """What host programs obey unasked is held in every run (config/hostrun.py); the
    install presets add the CI files, which an install never writes."""
    p = load_profile(name, context={**CTX, "cache": "/c/p"})
    protected = {e.path.removeprefix(CTX["workdir"] + "/") for e in p.protect if e.optional}
    assert protected == {".github", ".gitlab-ci.yml"}
    assert all(e.optional for e in p.protect)


def test_ports_are_read_merged_and_shown(tmp_path: Path) -> None:
    from boxy.values import parse_publish
    from boxyd.config import profileview

    base = tmp_path / "base.yaml"
    base.write_text("net: none\nports: ['8080:80']\n")
    child = tmp_path / "child.yaml"
    child.write_text(f"extends: {base}\nports: ['8080:80', '[::1]:9090:90']\n")
    p = profiles.load_profile(str(child), context=CTX)
    assert p.ports == [parse_publish("8080:80"), parse_publish("[::1]:9090:90")]
    lines = profileview.show_lines(p, None, "file", str(child))
    assert "  ports: [::1]:9090:90  ([::1]:9090 on this machine leads to port 90 inside)" in lines
    assert profileview.show_doc(p, None, "file", str(child))["ports"] == [
        "127.0.0.1:8080:80",
        "[::1]:9090:90",
    ]
    for bad, why in (
        ("ports: '8080:80'\n", "expected a list"),
        ("ports: [8080]\n", "expected a string"),
    ):
        child.write_text(bad)
        with pytest.raises(ProfileError, match=f"ports.*{why}"):
            profiles.load_profile(str(child), context=CTX)


def test_a_text_is_parsed_once_and_each_caller_gets_its_own_document() -> None:
    """The parse of a text is kept for the same text only; what comes out is a copy
    (a caller that changes it changes nothing for the next run); errors are not kept."""
    from boxyd.config import profiles as pr

    text = "description: kept\nallow_hosts: [a.example]\n"
    first = pr._parse_yaml("t", text)
    assert pr._PARSED[(pr._StrictLoader, text)] == first
    first["allow_hosts"].append("b.example")
    assert pr._parse_yaml("t", text) == {"description": "kept", "allow_hosts": ["a.example"]}
    assert pr._parse_yaml("t", text + "net: none\n")["net"] == "none"
    for _ in range(2):
        with pytest.raises(ProfileError, match="invalid YAML"):
            pr._parse_yaml("t", "a: [\n")
    assert all(k[1] != "a: [\n" for k in pr._PARSED)


def test_the_resolved_view_shows_every_key_of_the_table(tmp_path: Path) -> None:
    """Issue 32 §1: the view was written key by key and left six out (allow_cidr,
    tailscale, tmpfs, env_secrets, tty, tty_raw); now it is read from the table."""
    from boxy import options

    doc = {
        "description": "all of them", "net": "allowlist", "allow_hosts": ["a.example"],
        "allow_ports": [8443], "allow_cidr": ["192.0.2.0/24"], "tailscale": True,
        "ask": True, "ask_timeout": "30s", "ask_notify": True, "ports": ["127.0.0.1:8080:80"], "env": {"A": "1"}, "env_pass": ["P"],
        "env_secrets": ["S"], "seccomp": "compat", "tty": True, "tty_raw": True, "review": True,
        "filesystem": {k: ([{"src": "/etc/hosts", "dst": "/x"}] if "copy" in k else
                           ["/srv"] if k not in ("secrets", "generated") else ["*.key"]) for k in profileschema._FS_KEYS
                       if k != "tmpfs"} | {"tmpfs": ["/scratch"]},
        "limits": {"memory": "1GiB", "pids": 64, "cpus": 1.5, "timeout": "1h", "review": "1GiB"},
    }  # fmt: skip
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump(doc))
    view = profileview.view(str(path), str(tmp_path), str(tmp_path), None)
    assert set(view.doc) == {"name", "kind", "location"} | {k.attr for k in options.PROFILE_KEYS}
    assert all(view.doc[k.attr] not in (None, [], {}, False) for k in options.PROFILE_KEYS), (
        view.doc
    )
    shown = "\n".join(view.lines)
    for key in options.PROFILE_KEYS:
        name = key.path.rpartition(".")[2]
        label = {"allow_hosts": "allow_host", "allow_ports": "allow_port", "allow_cidr": "allow_cidr",
                 "env_pass": "env P", "env_secrets": "env S", "env": "env A"}.get(key.path, name)  # fmt: skip
        assert f"  {label}" in shown, (key, shown)


def test_a_profile_file_is_parsed_apart_and_a_preset_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file given with -p (or a user profile) could have been written by a payload:
    its YAML is parsed through the door (parsedoor.py), never in boxyd's process; a
    preset is boxy's own. Without a Parser in force, and this process not apart, a
    file's parse is refused loudly."""
    from boxyd.config import parsedoor
    from boxyd.daemon import parseproc

    path = tmp_path / "ci.yaml"
    path.write_text("extends: node\nnet: none\n")
    context = {"workdir": str(tmp_path), "home": str(tmp_path)}
    monkeypatch.setattr(parsedoor, "_local_allowed", False)
    assert load_profile("generic", context=context).name == "generic"
    with pytest.raises(RuntimeError, match="in boxyd's own process"):
        load_profile(str(path), context=context)
    got = parseproc.call_apart(
        lambda: parseproc.Apart(parseproc.fork_child),
        lambda: load_profile(str(path), context=context),
    )
    assert got.net == "none" and got.name == str(path)
    path.write_text("net: [unclosed\n")
    with pytest.raises(ProfileError, match="invalid YAML"):
        parseproc.call_apart(
            lambda: parseproc.Apart(parseproc.fork_child),
            lambda: load_profile(str(path), context=context),
        )


def test_a_list_past_its_bound_is_refused_naming_the_key(tmp_path: Path) -> None:
    """Attack finding F5: 6,000 ports in a profile and in the one it extends held a
    worker 40 s merging them (each entry compared with every other). A list is bounded,
    and the merge compares by a set."""
    from boxyd.config.profilemerge import merge
    from boxyd.config.profileschema import MAX_ENTRIES

    path = tmp_path / "many.yaml"
    path.write_text(yaml.safe_dump({"ports": [f"{8000 + i}:80" for i in range(MAX_ENTRIES + 1)]}))
    context = {"workdir": str(tmp_path), "home": str(tmp_path)}
    with pytest.raises(ProfileError, match=rf"key ports: {MAX_ENTRIES + 1} entries \(at most"):
        load_profile(str(path), context=context)
    base, child = Profile("b", "b"), Profile("c", "c")
    base.allow_cidrs = [f"10.{i // 256}.{i % 256}.0/24" for i in range(MAX_ENTRIES)]
    child.allow_cidrs = [*base.allow_cidrs[::-1], "192.0.2.0/24"]
    assert merge(base, child).allow_cidrs == [*base.allow_cidrs, "192.0.2.0/24"]


def test_a_profile_whose_view_is_huge_is_one_line(tmp_path: Path) -> None:
    """Attack finding F4: aliases made a 600 KB profile a 121 MB `profile show` reply,
    an internal error (and 121 MB of JSON encoded on boxyd's event loop)."""
    text = (
        "description: &d "
        + "x" * 60_000
        + "\nenv:\n"
        + "".join(f"  V{i}: *d\n" for i in range(100))
    )
    path = tmp_path / "big.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError, match=r"its view is \d+ bytes \(at most"):
        profileview.view(str(path), str(tmp_path), str(tmp_path), None)
