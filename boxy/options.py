"""The `boxyctl run` options: one table, read by everything that describes them.

Each entry says an option's flag names, help line, wire field (``RunOptions``'s
attribute and the Run call's JSON key), wire kind, the type of its command-line
value, its default (what a run gets when neither the flag nor the profile sets it),
its profile key, and the combinations it refuses. From it come boxyctl's argparse
flags and fast path (boxyctl.cli, boxyctl.parser), the help text, the man page and
the shell completions (boxyctl.completion reads the parser), ``RunOptions`` and its
wire decoding (boxy.request), the daemon's defaults (boxyd.config), and
``check_combinations``, which the client and the daemon both call.

Plain classes and no typing at run time: the client imports this on every run, and
dataclasses or typing cost it milliseconds.
"""

from __future__ import annotations

from boxy.errors import UsageError

TYPE_CHECKING = False  # typing costs the client 4 ms at start-up; annotations only
if TYPE_CHECKING:
    from typing import Any

# Wire kinds (how RunOptions.from_wire checks a field): str (a string or None), strs (a
# list of strings), hosts (a list of HOST[:PORT[,PORT]][/udp] strings, decoded to
# boxy.values.HostSpec), bool, size (bytes), count, number (positive, or None), ports,
# published (a list of [ADDR:]HOST_PORT:PORT strings, decoded to boxy.values.PortMapping),
# env, secrets, copies.
LIST_KINDS = ("strs", "hosts", "ports", "published", "env", "secrets", "copies")

_PUBLIC_PORTS = (
    "{flag}: cannot be combined with --net public (public mode allows every "
    "port; the list applies to --net allowlist)"
)
_NO_NETWORK = "{flag}: cannot be combined with --net {value} (no network at all)"


class Refusal:
    """OPTION (the entry this is listed under) given together with OTHER holding one
    of VALUES (None: OTHER not given) is refused with MESSAGE, a template of {flag}
    (the option's long flag) and {value} (OTHER's value)."""

    __slots__ = ("other", "values", "message")

    def __init__(self, other: str, values: tuple[object, ...], message: str) -> None:
        self.other, self.values, self.message = other, values, message


_NET_NONE = Refusal("net", ("none",), _NO_NETWORK)
_NET_PUBLIC = Refusal(
    "net",
    ("public",),
    "{flag}: cannot be combined with --net {value} (no name is refused to ask about)",
)


class Option:
    """One `run` option (see the module docstring). TYPE names how boxyctl reads the
    flag's text (boxyctl.cli._CONVERT); KIND, derived from WIRE, is its argparse
    shape: "value", "append" (repeatable) or "true" (a switch)."""

    __slots__ = (
        "names", "field", "wire", "type", "kind", "help", "metavar", "choices",
        "default", "profile_key", "refuses",
    )  # fmt: skip

    def __init__(
        self,
        names: tuple[str, ...],
        wire: str,
        type: str,
        help: str,
        *,
        metavar: str | None = None,
        choices: tuple[str, ...] | None = None,
        default: Any = None,
        profile_key: str | None = None,
        refuses: tuple[Refusal, ...] = (),
    ) -> None:
        self.names, self.wire, self.type = names, wire, type
        self.field = names[-1].lstrip("-").replace("-", "_")
        self.kind = "true" if wire == "bool" else ("append" if wire in LIST_KINDS else "value")
        # the default is written here once; the help line shows it
        self.help = help.format(default=_shown(wire, default)) if "{default}" in help else help
        self.metavar, self.choices, self.default = metavar, choices, default
        self.profile_key, self.refuses = profile_key, refuses

    @property
    def dest(self) -> str:
        """argparse's name for it (the wire field)."""
        return self.field

    @property
    def flag(self) -> str:
        """The long flag, as messages name the option."""
        return self.names[-1]

    def __repr__(self) -> str:
        return f"Option({self.flag})"


def _shown(wire: str, value: object) -> str:
    """A default as the help line writes it: 2GiB, not 2147483648."""
    if wire == "size" and isinstance(value, int):
        for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if value % (1 << shift) == 0:
                return f"{value >> shift}{unit}"
    return str(value)


class Key:
    """One key of a profile, a row of PROFILE_KEYS: PATH as a profile writes it (`net`,
    `filesystem.ro`), ATTR the Profile attribute it fills, CHECK how one value (of a list:
    one entry) is read (a method of the profile checker, boxyd/config/profileschema.py),
    SHAPE "one", "list" or "map", MERGE how `extends` and a project's .boxy.yaml put it
    on a base ("replace": the child's when set; "first": the child's when not empty;
    "append": the base's entries, then the child's; "union": the same without repeats;
    "map": the child's names override), WIDEN how an unapproved .boxy.yaml's value is
    held to the run's (a rule of boxyd/config/widening.py; "never": it cannot widen, so
    an approval does not commit to it), and FIELD the run option it stands for (set
    from the option table's profile_key column), if any."""

    __slots__ = ("path", "attr", "check", "shape", "merge", "widen", "field")

    def __init__(
        self,
        path: str,
        check: str,
        *,
        shape: str = "one",
        merge: str = "replace",
        widen: str = "never",
        attr: str | None = None,
    ) -> None:
        self.path, self.check, self.shape, self.merge, self.widen = path, check, shape, merge, widen
        self.attr = attr or path.rpartition(".")[2]
        self.field: str | None = None

    @property
    def top(self) -> str:
        """The top-level key it is written under (`filesystem` for filesystem.ro)."""
        return self.path.partition(".")[0]

    def __repr__(self) -> str:
        return f"Key({self.path})"


# Every key a profile (and a .boxy.yaml) may hold, in the order the checks and the
# hold-back go; `extends` is the loader's own. README's "Profiles" documents them.
# fmt: off
PROFILE_KEYS: tuple[Key, ...] = (
    Key("description", "string", merge="first"),
    Key("net", "choice", widen="rank"),
    Key("allow_hosts", "host", shape="list", merge="append", widen="allowlisted"),
    Key("allow_ports", "port", shape="list", merge="append", widen="allowlisted"),
    Key("allow_cidr", "cidrs", shape="list", merge="union", widen="ranges", attr="allow_cidrs"),
    Key("tailscale", "boolean", widen="tailnet"),
    Key("ask", "boolean"),
    Key("ask_timeout", "duration"),
    Key("ask_notify", "boolean"),
    Key("ports", "published", shape="list", merge="union", widen="granted"),
    Key("filesystem.ro", "path_entry", shape="list", merge="append", widen="readable"),
    Key("filesystem.rw", "path_entry", shape="list", merge="append", widen="writable"),
    Key("filesystem.mkdir", "path_entry", shape="list", merge="append", widen="writable"),
    Key("filesystem.protect", "path_entry", shape="list", merge="append", widen="kept"),
    Key("filesystem.reveal", "path_entry", shape="list", merge="append", widen="revealed"),
    Key("filesystem.copy", "copy_entry", shape="list", merge="append", widen="copies"),
    Key("filesystem.copy_ro", "copy_entry", shape="list", merge="append", widen="copies_ro"),
    Key("filesystem.tmpfs", "tmpfs_path", shape="list", merge="union"),
    Key("filesystem.secrets", "secret_glob", shape="list", merge="union", widen="kept"),
    Key("filesystem.generated", "secret_glob", shape="list", merge="union", widen="granted"),
    Key("review", "boolean", widen="switch"),
    Key("env", "env_value", shape="map", merge="map"),
    Key("env_pass", "name", shape="list", merge="union", widen="granted"),
    Key("env_secrets", "secret", shape="list", merge="union", widen="granted"),
    Key("limits.memory", "size", widen="at_most"),
    Key("limits.pids", "positive_int", widen="at_most"),
    Key("limits.cpus", "positive_number", widen="at_most"),
    Key("limits.timeout", "duration", widen="at_most"),
    Key("limits.review", "size", widen="at_most", attr="review_limit"),
    Key("seccomp", "choice", widen="rank"),
    Key("tty", "boolean", widen="switch"),
    Key("tty_raw", "boolean", widen="switch"),
)
# fmt: on
KEYS: dict[str, Key] = {k.path: k for k in PROFILE_KEYS}

# the built-in profiles (boxyd/profiles/NAME.yaml, held to this list by the tests): the
# client names them (help, completions) without reading boxyd's files
PRESETS = ("node", "python", "generic", "offline", "claude")


def is_profile_path(name: str) -> bool:
    """-p NAME names a file (made absolute by the client), not a profile by name."""
    return "/" in name or name.endswith((".yaml", ".yml"))


# fmt: off
RUN_OPTIONS: tuple[Option, ...] = (
    Option(('-p', '--profile'), 'str', 'profile', f'preset ({", ".join(PRESETS)}) or a YAML file', metavar='NAME|PATH', default='generic'),
    Option(('--ro',), 'strs', 'path', 'expose a path read-only (repeatable)', metavar='PATH', profile_key='filesystem.ro'),
    Option(('--rw',), 'strs', 'path', 'expose a path read-write (repeatable)', metavar='PATH', profile_key='filesystem.rw'),
    Option(('--protect',), 'strs', 'path', 'keep a path read-only inside a writable mount (repeatable)', metavar='PATH', profile_key='filesystem.protect'),
    Option(('--reveal',), 'strs', 'path', 'show a credential in the work tree as it is, instead of covered (repeatable)', metavar='PATH', profile_key='filesystem.reveal'),
    Option(('--mkdir',), 'strs', 'path', 'expose a directory read-write, creating it if absent (repeatable)', metavar='PATH', profile_key='filesystem.mkdir'),
    Option(('--allow-git-write',), 'bool', 'switch', 'let the sandbox write .git/hooks and .git/config'),
    Option(('--review',), 'bool', 'switch', "hold the payload's writes to the work directory for review (an overlay): boxyctl diff, apply, discard", profile_key='review'),
    Option(('--edit-config',), 'strs', 'path', 'let this run create or change a file host tools obey (.claude/, .npmrc, .vscode/, .envrc...), held otherwise (repeatable)', metavar='PATH'),
    Option(('--allow-host-config',), 'strs', 'path', "let a writable tree (-w, --rw, --mkdir) be, lie in or hold what host programs obey unasked (~/.ssh, your shell's rc files, ~/.local/bin, a project's .claude/...), refused otherwise; PATH names the tree (repeatable)", metavar='PATH'),
    Option(('--copy',), 'copies', 'copy', 'copy one file in, writable (repeatable)', metavar='SRC[:DST]', profile_key='filesystem.copy'),
    Option(('--copy-ro',), 'copies', 'copy', 'copy one file in, read-only (repeatable)', metavar='SRC[:DST]', profile_key='filesystem.copy_ro'),
    Option(('-w', '--workdir'), 'str', 'path', 'working directory, read-write (default: the current directory)', metavar='PATH'),
    Option(('--net',), 'str', 'choice', "network mode (default: the profile's; {default} without one; allowlist with --allow-host)", choices=('public', 'allowlist', 'none'), default='public', profile_key='net'),
    Option(('--allow-host',), 'hosts', 'host', 'reachable host name, or an address (that address only); implies allowlist (repeatable)', metavar='HOST[:PORT[,PORT]][/udp]', profile_key='allow_hosts',
           refuses=(Refusal('net', ('none', 'public'), '{flag}: cannot be combined with --net {value} (it implies allowlist)'),)),
    Option(('--allow-port',), 'ports', 'port', 'permitted outbound TCP port in allowlist mode; replaces the default 80, 443 (repeatable)', metavar='N', profile_key='allow_ports',
           refuses=(Refusal('net', ('public',), _PUBLIC_PORTS), _NET_NONE)),
    Option(('--allow-cidr',), 'strs', 'cidrs', 'lift the private-address denial for a range (its hosts still need --allow-host) (repeatable)', metavar='CIDR', profile_key='allow_cidr', refuses=(_NET_NONE,)),
    Option(('--tailscale',), 'bool', 'switch', "reach this machine's tailnet by MagicDNS name", profile_key='tailscale', refuses=(_NET_NONE,)),
    Option(('--ask',), 'bool', 'switch', 'ask before refusing a name the allowlist does not hold (the session waits; nobody answers: refused)', profile_key='ask', refuses=(_NET_NONE, _NET_PUBLIC)),
    Option(('--ask-timeout',), 'number', 'duration', 'how long a question waits for its answer before the name is refused (default 60s)', metavar='DURATION', profile_key='ask_timeout', refuses=(_NET_NONE, _NET_PUBLIC)),
    Option(('--ask-notify',), 'bool', 'switch', 'ask as --ask does, and when no terminal or bus client can answer, as a desktop notification with the choices as its actions', profile_key='ask_notify', refuses=(_NET_NONE, _NET_PUBLIC)),
    Option(('--publish',), 'published', 'publish', "let this machine reach PORT on the sandbox's loopback at ADDR:HOST_PORT (ADDR 127.0.0.1 unless given); any --net mode (repeatable)", metavar='[ADDR:]HOST_PORT:PORT', profile_key='ports'),
    Option(('-e', '--env'), 'env', 'env', 'pass (NAME) or set (NAME=VAL) an environment variable (repeatable)', metavar='NAME[=VAL]', profile_key='env'),
    Option(('--secret',), 'secrets', 'secret', "pass NAME's value from your environment as a secret: never in an argv, a log or a record; with @HOST the payload gets a placeholder of its shape, and the value is put in requests to those hosts alone, over TLS (repeatable)", metavar='NAME[@HOST,...]', profile_key='env_secrets'),
    Option(('--memory',), 'size', 'size', 'size of the scratch tmpfs ($HOME, /tmp, /dev/shm), and the memory limit where a controller is delegated (default {default})', metavar='SIZE', default=2 << 30, profile_key='limits.memory'),
    Option(('--pids',), 'count', 'count', 'process/thread limit (default {default})', metavar='N', default=512, profile_key='limits.pids'),
    Option(('--cpus',), 'number', 'cpus', 'CPU limit, fractions allowed', metavar='N', profile_key='limits.cpus'),
    Option(('--timeout',), 'number', 'duration', 'stop the run after this long (e.g. 10m, 1h30m)', metavar='DURATION', profile_key='limits.timeout'),
    Option(('--review-limit',), 'size', 'size', 'the most the layer --review holds may take on disk; the run is stopped past it (default {default})', metavar='SIZE', default=4 << 30, profile_key='limits.review'),
    Option(('--audit-log',), 'str', 'path', 'policy decisions as JSON lines', metavar='FILE'),
    Option(('--net-log',), 'str', 'path', 'every connection, hostname and SNI', metavar='FILE', refuses=(_NET_NONE,)),
    Option(('--pcap',), 'str', 'path', "every packet on the sandbox's link, pcap format", metavar='FILE', refuses=(_NET_NONE,)),
    Option(('--pcap-max',), 'size', 'size', 'stop the capture at this size (default {default})', metavar='SIZE', default=1 << 30,
           refuses=(Refusal('pcap', (None,), '{flag}: needs --pcap'),)),
    Option(('--seccomp',), 'str', 'choice', '{default} (default) or compat (kills become EPERM)', choices=('strict', 'compat'), default='strict', profile_key='seccomp'),
    # --tty with -d is refused by the daemon alone (boxyd.config.limits.terminal), with the profile's tty
    Option(('--tty',), 'bool', 'switch', 'require a terminal: refused unless stdin, stdout or stderr is one (a terminal is always relayed through a PTY)', profile_key='tty'),
    Option(('--tty-raw',), 'bool', 'switch', "pass the payload's output to the terminal unfiltered: clipboard writes (OSC 52) and queries whose answers the terminal would type included", profile_key='tty_raw'),
    Option(('-v', '--verbose'), 'bool', 'switch', 'report denials and skipped entries on stderr'),
    Option(('-d', '--detach'), 'bool', 'switch', 'run in the background: print the session id (boxyctl attach ID takes it over)'),
)
# fmt: on
BY_FIELD: dict[str, Option] = {o.field: o for o in RUN_OPTIONS}
for _o in RUN_OPTIONS:  # each option's profile key knows its option (a KeyError: a typo)
    if _o.profile_key is not None:
        KEYS[_o.profile_key].field = _o.field
BY_FLAG: dict[str, Option] = {name: o for o in RUN_OPTIONS for name in o.names}


def default(field: str) -> Any:
    """What a run gets for FIELD when neither the flag nor the profile sets it."""
    return BY_FIELD[field].default


def choices(field: str) -> tuple[str, ...]:
    """The values FIELD takes (--net, --seccomp); the profile keys take the same."""
    found = BY_FIELD[field].choices
    if found is None:
        raise KeyError(f"{field} takes no fixed choices")
    return found


def given(value: object) -> bool:
    """Whether an option was given: not None, False or an empty list."""
    return value is not None and value is not False and value != []


def check_combinations(options: object, **resolved: object) -> None:
    """Refuse the combinations the table lists, with the first refusal (in the table's
    order) as a UsageError. OPTIONS is anything with the table's fields as attributes
    (a RunOptions); RESOLVED overrides some of them with what the daemon decided from
    the profile (net=), so a profile that makes a run --net none refuses --pcap as the
    flag would."""
    for option in RUN_OPTIONS:
        mine = (
            resolved[option.field] if option.field in resolved else getattr(options, option.field)
        )
        if not option.refuses or not given(mine):
            continue
        for refusal in option.refuses:
            other = (
                resolved[refusal.other]
                if refusal.other in resolved
                else getattr(options, refusal.other)
            )
            if (other if given(other) else None) in refusal.values:
                raise UsageError(refusal.message.format(flag=option.flag, value=other))


# The varlink type of each wire kind (boxy/dev.boxy.Manager.varlink's RunOptions).
IDL_TYPES = {
    "str": "?string",
    "strs": "?[]string",
    "hosts": "?[]string",
    "bool": "?bool",
    "size": "?int",
    "count": "?int",
    "number": "?float",
    "ports": "?[]int",
    "published": "?[]string",
    "env": "?[]EnvItem",
    "secrets": "?[]Secret",
    "copies": "?[]CopyItem",
}
IDL_BEGIN = "# -- RunOptions: generated from boxy/options.py (python -m boxy.options) --"
IDL_END = "# -- end of RunOptions --"


def idl_types() -> str:
    """The IDL's RunOptions and its item types: one field per option, its flags and
    help line as the comment (between IDL_BEGIN and IDL_END in the IDL file)."""
    import textwrap  # not on the client's run path

    lines = [
        IDL_BEGIN,
        "# boxy.request.RunOptions: one field per `boxyctl run` option.",
        "type RunOptions (",
    ]
    for i, option in enumerate(RUN_OPTIONS):
        about = f"{', '.join(option.names)}: {option.help}"
        lines += textwrap.wrap(about, 82, initial_indent="  # ", subsequent_indent="  # ")
        comma = "," if i < len(RUN_OPTIONS) - 1 else ""
        lines.append(f"  {option.field}: {IDL_TYPES[option.wire]}{comma}")
    lines += [
        ")",
        "",
        "# -e NAME (value null, present false: the client does not have it) or NAME=VAL",
        "type EnvItem (name: string, value: ?string, present: ?bool)",
        "",
        "type Secret (name: string, value: string, hosts: ?[]string)",
        "",
        "# --copy SRC[:DST]",
        "type CopyItem (src: string, dst: ?string)",
        IDL_END,
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(idl_types(), end="")
