"""boxyctl's subcommands, one row each, as `run`'s flags are rows of boxy/options.py.
A row is everything said about a subcommand: its help and description, its flags,
positionals and actions, what cli.parse puts in its Command's args, and the module
that runs it (boxyctl/commands/<module>.py, whose main(args) returns the exit
status). The parser (boxyctl/parser.py) and through it the man page and the
completions (boxyctl/completion.py), cli.parse and main's dispatch read this table.

Plain classes and tuples: nothing here costs a client start."""

from __future__ import annotations


class Arg:
    """A flag (NAMES start with '-'; a switch, True when given) or a positional (one
    name, its field; KIND: "id" a session id, "id?" one or none, "ids" one or more,
    "word" a word, one of CHOICES when there are any, "words" one or more, "words?"
    any number)."""

    __slots__ = ("names", "help", "kind", "metavar", "choices", "field")

    def __init__(
        self,
        *names: str,
        help: str,
        kind: str = "switch",
        metavar: str = "",
        choices: tuple[str, ...] = (),
    ) -> None:
        self.names, self.help, self.kind = names, help, kind
        self.metavar, self.choices = metavar, choices
        self.field = names[-1].lstrip("-").replace("-", "_")

    @property
    def positional(self) -> bool:
        return self.kind != "switch"


class Sub:
    """A subcommand, or one of its ACTIONS (profile show, daemon stop). MODULE: the one
    under boxyctl/commands that runs it (its name by default; "" for `hook`, which
    main hands its argv unparsed: boxyctl/hook.py). CWD: its args carry the client's
    current directory. EXCLUSIVE: switches that exclude each other; NEEDS: (switch,
    the switch it goes with) pairs. NO_JSON: for a row without --json, where what a
    script wants is instead (said when --json is given to it)."""

    __slots__ = (
        "name", "help", "args", "actions", "module", "description", "cwd", "exclusive", "needs",
        "no_json",
    )  # fmt: skip

    def __init__(
        self,
        name: str,
        help: str,
        *,
        args: tuple[Arg, ...] = (),
        actions: tuple[Sub, ...] = (),
        module: str | None = None,
        description: str = "",
        cwd: bool = False,
        exclusive: tuple[str, ...] = (),
        needs: tuple[tuple[str, str], ...] = (),
        no_json: str = "",
    ) -> None:
        self.name, self.help, self.args, self.actions = name, help, args, actions
        self.module = name if module is None else module
        self.description = description or help
        self.cwd, self.exclusive, self.needs = cwd, exclusive, needs
        self.no_json = no_json

    def action(self, name: str) -> Sub:
        return next(a for a in self.actions if a.name == name)

    def usage(self) -> str:
        """NAME and its positionals (`show NAME`): a missing action's line lists them."""
        return " ".join([self.name, *(a.metavar for a in self.args if a.positional)])


SESSION_ID = "a session id (as `boxyctl ps` lists them) or its unique prefix"
_JSON = Arg("--json", help="one JSON document on stdout")
_FORCE = Arg("--force", help="stop running sessions first (SIGTERM, grace, SIGKILL; recorded)")


def _policy_change(name: str, help: str, hosts: str, description: str) -> Sub:
    """`allow` and `deny`: ID HOST... (boxyctl/commands/allow.py runs both)."""
    return Sub(
        name,
        help,
        args=(
            Arg("id", kind="id", metavar="ID", help=SESSION_ID),
            Arg("hosts", kind="words", metavar="HOST", help=hosts),
        ),
        description=description,
        no_json="`show --json ID` has the session's policy lines",
    )


SUBCOMMANDS: tuple[Sub, ...] = (
    Sub(  # its flags: the option table (boxy/options.py)
        "run",
        "run a command in a sandbox",
        no_json="--report FILE writes the run's summary as JSON",
    ),
    Sub(
        "ps",
        "list running sessions",
        args=(
            Arg("-a", "--all", help="every session on record"),
            Arg("-q", "--quiet", help="only the ids, one a line"),
            _JSON,
        ),
        description="List the sessions boxyd is running (with -a, every session on record): "
        "id, state, start, running time, profile and command.",
    ),
    Sub(
        "show",
        "one session in full",
        args=(Arg("id", kind="id", metavar="ID", help=SESSION_ID), _JSON),
        description="One session in full: its command, work directory, profile, state, exit, "
        "network totals, limits and, once it ended, its findings and destinations.",
    ),
    Sub(
        "logs",
        "a detached session's output",
        args=(
            Arg("-f", "--follow", help="follow until it ends"),
            Arg("id", kind="id", metavar="ID", help=SESSION_ID),
        ),
        no_json="it writes the session's output as the session wrote it; "
        "`show --json ID` has the session",
    ),
    Sub(
        "watch",
        "follow a session as it happens",
        args=(
            Arg(
                "id", kind="id?", metavar="ID", help=SESSION_ID + " (default: the only running one)"
            ),
        ),
        description="Follow a session as it happens: its network, denials and events, "
        "repainted as they come (one line per event into a pipe), then its summary. "
        "Without ID, the only running session.",
        no_json="into a pipe it writes one line per event; `show --json ID` has the session",
    ),
    Sub(
        "diff",
        "what a session held for review changed",
        args=(
            Arg("id", kind="id", metavar="ID", help=SESSION_ID),
            Arg("--stat", help="the summary only, no unified diff"),
            _JSON,
        ),
        description="What a session run with --review changed in its work directory: a "
        "summary (added, changed, removed, with sizes; what apply would refuse, and why), "
        "then a unified diff of its text files. Trees the profile marks generated "
        "(filesystem.generated: node_modules, venvs) are listed, not diffed.",
    ),
    Sub(
        "apply",
        "land a reviewed session's changes in its work directory",
        args=(
            Arg("id", kind="id", metavar="ID", help=SESSION_ID),
            Arg(
                "paths",
                kind="words?",
                metavar="PATH",
                help="only these (relative to the work directory; a directory: all in it)",
            ),
            _JSON,
        ),
        description="Land the changes of a session run with --review (all, or those PATHs) "
        "in its work directory. A file the host changed since the session started is "
        "refused and named, as is what the guards hold (a git control file, a file host "
        "programs obey, a device or FIFO); no symlink on the host is followed. What is "
        "left stays held.",
    ),
    Sub(
        "discard",
        "drop a reviewed session's changes",
        args=(Arg("id", kind="id", metavar="ID", help=SESSION_ID),),
        description="Drop the changes a session run with --review holds; the work "
        "directory is left as it is.",
        no_json="it prints one line; `show --json ID` has the session",
    ),
    Sub(
        "attach",
        "take over a session's terminal",
        args=(Arg("id", kind="id", metavar="ID", help=SESSION_ID),),
        description="Take over the terminal of a session started with -d (or left with "
        "Ctrl-]); Ctrl-] leaves it again, and the session lives on.",
    ),
    _policy_change(
        "allow",
        "allow hosts in a running session, at once",
        "HOST[:PORT[,PORT]][/udp], *.SUFFIX or an address (one or more)",
        "Allow hosts in a running session's allowlist at once: its DNS, "
        "its connections and the gateway's sets, recorded in its audit log with who "
        "asked (show and watch say it). What was fixed at its start does not widen: a "
        "range only --allow-cidr opens, a port outside its Landlock rules (refused, "
        "naming the run that would allow it).",
    ),
    _policy_change(
        "deny",
        "refuse hosts in a running session from now on",
        "a name, *.SUFFIX or an address, on every port (one or more)",
        "Refuse hosts in a running session from now on, even below an "
        "allowed *.SUFFIX: its DNS answers nothing for them, and its open connections "
        "they decided are cut. Recorded as allow is.",
    ),
    Sub(
        "stop",
        "SIGTERM, then SIGKILL",
        args=(
            Arg("-k", "--kill", help="SIGKILL now"),
            Arg("ids", kind="ids", metavar="ID", help=SESSION_ID + " (one or more)"),
            Arg("--json", help="the sessions' final states as one JSON document on stdout"),
        ),
        description="Stop sessions: SIGTERM, then SIGKILL after a grace of 5 seconds if one "
        "is still running; -k sends SIGKILL at once. Prints each session's final state.",
    ),
    Sub(
        "doctor",
        "check what this kernel and host provide",
        args=(_JSON,),
        description="Check what this kernel and host provide (user namespaces, Landlock, "
        "seccomp, cgroup delegation, nftables, the user manager) and what each missing "
        "layer costs a run.",
    ),
    Sub(
        "profile",
        "list or show profiles",
        actions=(
            Sub("list", "the presets", args=(_JSON,)),
            Sub(
                "show",
                "a preset's text",
                args=(
                    Arg(
                        "name",
                        kind="word",
                        metavar="NAME",
                        help="a preset's name, or one of your own profiles'",
                    ),
                    _JSON,
                ),
            ),
        ),
    ),
    Sub(
        "daemon",
        "the boxyd daemon",
        actions=(
            Sub("status", "which build is running, and how busy it is", args=(_JSON,)),
            Sub(
                "restart",
                "replace it with this build",
                args=(_FORCE,),
                no_json="`daemon status --json` says what runs",
            ),
            Sub(
                "stop",
                "stop it (refused while sessions are running)",
                args=(_FORCE,),
                no_json="`daemon status --json` says what runs",
            ),
        ),
    ),
    Sub(
        "cache",
        "the per-project package caches of the node and python profiles",
        cwd=True,
        actions=(
            Sub(
                "list",
                "every project's cache: profile, size, last use, work directory",
                args=(_JSON,),
            ),
            Sub(
                "clean",
                "remove this work directory's caches",
                args=(Arg("--all", help="every project's"),),
                no_json="`cache list --json` lists the caches",
            ),
        ),
    ),
    Sub(
        "setup",
        "install boxyd's systemd user units and enable its socket",
        description="Install boxyd's systemd user units and enable its socket, so boxyd "
        "starts on demand; without a user manager, boxyctl starts boxyd itself.",
    ),
    Sub(
        "trust",
        "approve this directory's .boxy.yaml and the registries its .npmrc or pip.conf names",
        cwd=True,
        args=(
            Arg("--list", help="every approval: directory, hash, what"),
            Arg("--revoke", help="withdraw this directory's approvals"),
            _JSON,
        ),
        exclusive=("list", "revoke"),
        needs=(("json", "list"),),
    ),
    Sub(
        "completion",
        "print the shell completion script",
        args=(
            Arg(
                "shell",
                kind="word",
                metavar="SHELL",
                choices=("bash", "zsh", "fish"),
                help="bash, zsh or fish",
            ),
        ),
        description="Print the completion script for SHELL on stdout, e.g.\n"
        "  boxyctl completion bash > ~/.local/share/bash-completion/completions/boxyctl",
    ),
    Sub(
        "hook",
        "sandbox the commands an agent runs (Claude Code)",
        module="",
        actions=(
            Sub("claude", "Claude Code's PreToolUse hook (its JSON on stdin)"),
            Sub(
                "install",
                "add the hook to Claude Code's settings",
                args=(
                    Arg(
                        "harness",
                        kind="word",
                        metavar="HARNESS",
                        choices=("claude",),
                        help="the agent harness: claude (Claude Code)",
                    ),
                    Arg("--project", help="the project's .claude/settings.json"),
                    Arg("--remove", help="take the hook out"),
                ),
            ),
        ),
    ),
)

BY_NAME = {s.name: s for s in SUBCOMMANDS}
