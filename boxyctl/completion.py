"""Shell completion (bash, zsh, fish) and the boxyctl(1) man page, both generated from
the parser itself (boxyctl.parser.build_parser, which reads the option table,
boxy.options.RUN_OPTIONS): a flag the parser takes is a flag completion offers and the
man page documents, never a copy.

    boxyctl completion bash|zsh|fish     the script, on stdout
    python -m boxyctl.completion man     the man page (make setup installs both)
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field

from boxyctl import parser as p
from boxyctl.commands.table import BY_NAME

SHELLS = ("bash", "zsh", "fish")
_PATHLIKE = re.compile(r"PATH|FILE|SRC|DST")


@dataclass
class Context:
    """One command level: its flags (with their values) and its subcommands."""

    flags: dict[str, argparse.Action] = field(default_factory=dict)
    commands: dict[str, Context] = field(default_factory=dict)
    helps: dict[str, str] = field(default_factory=dict)  # subcommand -> its help line
    positionals: list[argparse.Action] = field(default_factory=list)


def tree(parser: argparse.ArgumentParser | None = None) -> Context:
    parser = parser or p.build_parser("boxyctl")
    ctx = Context()
    for action in parser._actions:  # argparse's own record of what it takes
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                ctx.helps[choice.dest] = choice.help or ""
            for name, sub in action.choices.items():
                ctx.commands[name] = tree(sub)
        elif action.option_strings:
            for opt in action.option_strings:
                ctx.flags[opt] = action
        elif action.help != argparse.SUPPRESS:
            ctx.positionals.append(action)
    return ctx


def takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def is_path(action: argparse.Action) -> bool:
    return bool(action.metavar and _PATHLIKE.search(str(action.metavar)))


def _contexts(ctx: Context, path: str = "") -> list[tuple[str, Context]]:
    out = [(path, ctx)]
    for name, sub in ctx.commands.items():
        out += _contexts(sub, f"{path}.{name}" if path else name)
    return out


# --- bash (zsh loads the same through bashcompinit) --------------------------------------


# The end of _boxyctl_data, then the completion function: it walks the words typed so
# far and asks _boxyctl_data (generated from the parser) what each context takes.
_BASH_FUNCTION = [
    "    esac",
    "}",
    "",
    "_boxyctl() {",
    "    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}",
    '    local ctx="" i w skip=0',
    "    for ((i = 1; i < COMP_CWORD; i++)); do",
    "        w=${COMP_WORDS[i]}",
    "        if ((skip)); then skip=0; continue; fi",
    "        if [[ $ctx == run && ( $w == -- || $w != -* ) ]]; then",
    "            # the sandboxed command: its name, then its own arguments",
    "            if [[ $w == -- && $i -eq $((COMP_CWORD - 1)) ]]; then",
    '                COMPREPLY=($(compgen -c -- "$cur"))',
    "            else",
    '                COMPREPLY=($(compgen -f -- "$cur"))',
    "            fi",
    "            return",
    "        fi",
    '        if [[ " $(_boxyctl_data values "$ctx") " == *" $w "* ]]; then skip=1; continue; fi',
    '        if [[ " $(_boxyctl_data commands "$ctx") " == *" $w "* ]]; then',
    "            ctx=${ctx:+$ctx.}$w",
    "        fi",
    "    done",
    "    local choices",
    '    choices=$(_boxyctl_data choices "$ctx:$prev")',
    "    case $choices in",
    '        "<path>") COMPREPLY=($(compgen -f -- "$cur")); return ;;',
    '        "<dir>") COMPREPLY=($(compgen -d -- "$cur")); return ;;',
    '        "<profile>") COMPREPLY=($(compgen -W "$(_boxyctl_profiles)" -- "$cur")); return ;;',
    '        "<value>") COMPREPLY=(); return ;;',
    '        ?*) COMPREPLY=($(compgen -W "$choices" -- "$cur")); return ;;',
    "    esac",
    "    if [[ $cur == -* ]]; then",
    '        COMPREPLY=($(compgen -W "$(_boxyctl_data flags "$ctx")" -- "$cur"))',
    "        return",
    "    fi",
    '    case $(_boxyctl_data positional "$ctx") in',
    '        "<session>") COMPREPLY=($(compgen -W "$(_boxyctl_sessions)" -- "$cur")) ;;',
    '        "<profile>") COMPREPLY=($(compgen -W "$(_boxyctl_profiles)" -- "$cur")) ;;',
    '        *) COMPREPLY=($(compgen -W "$(_boxyctl_data commands "$ctx")" -- "$cur")) ;;',
    "    esac",
    "}",
    "",
    "# the running sessions' ids, one a line",
    "_boxyctl_sessions() {",
    '    "${COMP_WORDS[0]}" ps -q 2>/dev/null',
    "}",
    "complete -F _boxyctl boxyctl boxy",
    "",
]


def value_kind(action: argparse.Action) -> str | None:
    """What a flag's value completes to beyond its choices: '<profile>' (-p), '<dir>'
    (-w), '<path>', '<value>' (nothing to offer), or None (a switch)."""
    if action.dest == "profile":
        return "<profile>"
    if action.dest == "workdir":
        return "<dir>"
    if is_path(action):
        return "<path>"
    return "<value>" if takes_value(action) else None


def positional_kind(path: str, ctx: Context) -> str | None:
    """What a command's positional completes to: session ids (show, attach, stop,
    watch: their ID), profile names (profile show NAME)."""
    metavars = [str(a.metavar) for a in ctx.positionals]
    if "ID" in metavars:
        return "<session>"
    if path == "profile.show":
        return "<profile>"
    return None


def _profiles_function() -> list[str]:
    """_boxyctl_profiles: the presets (known when the script is made) and the user's own
    (NAME.yaml under the config home, looked up when completing)."""
    presets = " ".join(sorted(_presets()))
    return [
        "",
        "_boxyctl_profiles() {",
        f'    echo "{presets}"',
        "    local f",
        '    for f in "${XDG_CONFIG_HOME:-$HOME/.config}"/boxy/profiles/*.yaml; do',
        '        [[ -e $f ]] && basename "$f" .yaml',
        "    done",
        "}",
    ]


def _presets() -> list[str]:
    from boxy.options import PRESETS

    return list(PRESETS)


def bash() -> str:
    contexts = _contexts(tree())
    lines = [
        "# bash completion for boxyctl and boxy, generated by `boxyctl completion bash`",
        "_boxyctl_data() {  # $1: what, $2: context",
        '    case "$1:$2" in',
    ]
    for path, ctx in contexts:
        values = [f for f, a in ctx.flags.items() if takes_value(a)]
        lines.append(f'        "flags:{path}") echo "{" ".join(ctx.flags)}" ;;')
        words = [*ctx.commands, *(c for a in ctx.positionals for c in (a.choices or ()))]
        lines.append(f'        "commands:{path}") echo "{" ".join(words)}" ;;')
        lines.append(f'        "values:{path}") echo "{" ".join(values)}" ;;')
        if (kind := positional_kind(path, ctx)) is not None:
            lines.append(f'        "positional:{path}") echo "{kind}" ;;')
        for flag, action in ctx.flags.items():
            shown = " ".join(action.choices) if action.choices else value_kind(action)
            if shown is not None:
                lines.append(f'        "choices:{path}:{flag}") echo "{shown}" ;;')
    lines += _BASH_FUNCTION[:-2] + _profiles_function() + _BASH_FUNCTION[-2:]
    return "\n".join(lines)


def zsh() -> str:
    return (
        "#compdef boxyctl boxy\n# zsh completion for boxyctl, generated by `boxyctl "
        "completion zsh`: the bash one, through zsh's bashcompinit\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + bash()
    )


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# fish's command substitutions for what bash completes in its own functions
_FISH_VALUES = {
    "<dir>": "(__fish_complete_directories)",
    "<session>": "(boxyctl ps -q 2>/dev/null)",
    "<profile>": "(printf '%s\\n' {presets} (path basename -E "
    "(set -q XDG_CONFIG_HOME; and echo $XDG_CONFIG_HOME; or echo ~/.config)"
    "/boxy/profiles/*.yaml 2>/dev/null))",
}


def _fish_value(kind: str) -> str:
    return _FISH_VALUES[kind].replace("{presets}", " ".join(_presets()))


def fish() -> str:
    lines = ["# fish completion for boxyctl and boxy, generated by `boxyctl completion fish`"]
    for prog in ("boxyctl", "boxy"):
        for path, ctx in _contexts(tree()):
            words = path.split(".") if path else []
            cond = (
                "__fish_use_subcommand"
                if not words
                else " && ".join(f"__fish_seen_subcommand_from {w}" for w in words)
            )
            for name in ctx.commands:
                lines.append(
                    f"complete -c {prog} -f -n {_fish_quote(cond)} -a {name} "
                    f"-d {_fish_quote(ctx.helps.get(name, ''))}"
                )
            if (kind := positional_kind(path, ctx)) is not None:
                lines.append(
                    f"complete -c {prog} -f -n {_fish_quote(cond)} "
                    f"-a {_fish_quote(_fish_value(kind))}"
                )
            seen: set[int] = set()
            for action in ctx.flags.values():
                if id(action) in seen:
                    continue
                seen.add(id(action))
                spec = " ".join(
                    f"-l {o[2:]}" if o.startswith("--") else f"-s {o[1:]}"
                    for o in action.option_strings
                )
                extra = ""
                kind = value_kind(action)
                if action.choices:
                    extra = f" -x -a {_fish_quote(' '.join(action.choices))}"
                elif kind in _FISH_VALUES:
                    extra = f" -x -a {_fish_quote(_fish_value(kind))}"
                elif takes_value(action):
                    extra = " -r" if is_path(action) else " -x"
                lines.append(
                    f"complete -c {prog} -n {_fish_quote(cond)} {spec}{extra} "
                    f"-d {_fish_quote(action.help or '')}"
                )
    return "\n".join(lines) + "\n"


# --- the man page ------------------------------------------------------------------------


def _roff(text: str) -> str:
    out = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(("\\&" + ln) if ln.startswith((".", "'")) else ln for ln in out.split("\n"))


def man() -> str:
    from boxy import VERSION
    from boxy.buildid import build_id

    root = tree()
    out = [
        f'.TH BOXYCTL 1 "" "boxy {VERSION} (build {build_id()})" "User Commands"',
        ".SH NAME",
        "boxyctl, boxy \\- run an untrusted program with its project directory and nothing else",
        ".SH SYNOPSIS",
        ".B boxyctl run\n[\\fIflags\\fR] [\\fB\\-\\-\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR...]",
        ".br",
        ".B boxyctl\n\\fICOMMAND\\fR ...",
        ".SH DESCRIPTION",
        _roff(p.RUN_DESCRIPTION),
        ".SH COMMANDS",
    ]
    out += _man_commands(root)
    out.append(".SH RUN FLAGS")
    out += _man_flags(root.commands["run"])
    status = " ".join(ln.strip() for ln in p.EXIT_STATUS.splitlines()[1:])
    out += [".SH EXIT STATUS", _roff(status)]
    out += _MAN_TAIL
    return "\n".join(out)


def _man_commands(root: Context) -> list[str]:
    """Each subcommand: its line, its description, its arguments and flags (run's flags
    have a section of their own)."""
    out: list[str] = []
    for name, help_text in root.helps.items():
        sub = root.commands[name]
        out += [".TP", f"\\fB{name}\\fR {_man_usage(sub)}".rstrip(), _roff(help_text)]
        row = BY_NAME.get(name)
        if row is not None and row.description != row.help:
            for line in row.description.split("\n"):  # every line: an example too
                out += [".br", _roff(line)]
        if name != "run":
            out += [".RS"] + _man_flags(sub) + _man_positionals(sub) + [".RE"]
        for action_name, action_help in sub.helps.items():
            nested = sub.commands[action_name]
            line = f"\\fB{name} {action_name}\\fR {_man_usage(nested)}".rstrip()
            out += [".TP", line, _roff(action_help)]
            out += [".RS"] + _man_flags(nested) + _man_positionals(nested) + [".RE"]
    return out


def _man_usage(ctx: Context) -> str:
    """A command's positionals as its line shows them: ID, [ID] (optional), ID...
    (one or more)."""
    words = []
    for action in ctx.positionals:
        word = f"\\fI{_roff(str(action.metavar))}\\fR"
        if action.nargs == "?":
            word = f"[{word}]"
        elif action.nargs in ("+", "*"):
            word += "..."
        words.append(word)
    return " ".join(words)


def _man_positionals(ctx: Context) -> list[str]:
    out: list[str] = []
    for action in ctx.positionals:
        if action.help:
            out += [".TP", f"\\fI{_roff(str(action.metavar))}\\fR", _roff(action.help)]
    return out


def _man_flags(ctx: Context) -> list[str]:
    """CTX's flags but -h, one .TP each."""
    out: list[str] = []
    seen: set[int] = set()
    for action in ctx.flags.values():
        if id(action) in seen or action.dest == "help":
            continue
        seen.add(id(action))
        names = ", ".join(f"\\fB{_roff(o)}\\fR" for o in action.option_strings)
        value = (
            f" \\fI{_roff(str(action.metavar))}\\fR"
            if takes_value(action) and action.metavar
            else ""
        )
        if action.choices:
            value = " " + "|".join(_roff(c) for c in action.choices)
        out += [".TP", names + value, _roff(action.help or "")]
    return out


_MAN_TAIL = [
    ".SH ENVIRONMENT",
    ".TP",
    "BOXY_DEBUG",
    "set to 1: an internal error shows its traceback instead of one line",
    ".TP",
    "BOXY_UPSTREAM_DNS",
    "ADDRESS[:PORT],...: the resolvers boxyd's DNS proxy asks, instead of /etc/resolv.conf's "
    "nameservers (read by boxyd when it starts)",
    ".TP",
    "BOXY_IDLE_EXIT",
    "seconds with no session and no client before boxyd exits (default 600; 0: never; "
    "read by boxyd when it starts)",
    ".TP",
    "XDG_RUNTIME_DIR, XDG_CONFIG_HOME, XDG_STATE_HOME, XDG_CACHE_HOME",
    "where the socket, your profiles and approvals, the session records and the package "
    "caches live",
    ".TP",
    "npm_config_registry, PIP_INDEX_URL, GOPROXY",
    "the registry a profile's {npm_registry}, {pip_index} and the like mean, "
    "as the tools read them",
    ".TP",
    "TERM, LANG, LC_*, TZ",
    "may be passed on to the command; nothing else of your environment is, but what "
    "\\fB\\-e\\fR, \\fB\\-\\-secret\\fR and a profile's env_pass name",
    ".SH FILES",
    ".TP",
    "$XDG_RUNTIME_DIR/boxy/boxyd.sock",
    "the daemon's varlink socket",
    ".TP",
    "$XDG_CONFIG_HOME/boxy/profiles/NAME.yaml",
    "your own profiles (\\fB\\-p\\fR NAME)",
    ".TP",
    "\\&.boxy.yaml",
    "a project's own settings, applied once \\fBboxyctl trust\\fR approved them",
    ".TP",
    "$XDG_STATE_HOME/boxy/sessions/",
    "session records",
    ".TP",
    "$XDG_STATE_HOME/boxy/quarantine/",
    "what the git guard moved out of a work tree",
    ".SH EXAMPLES",
    ".TP",
    "boxyctl run \\-p node \\-\\- npm ci",
    "install a project's dependencies with only npm's registry reachable",
    ".TP",
    "boxyctl run \\-\\-net none \\-\\- make test",
    "run the tests with no network at all",
    ".TP",
    "boxyctl run \\-\\-allow\\-host example.com \\-\\- ./fetch.sh",
    "allowlist mode: example.com on ports 80 and 443, nothing else",
    ".TP",
    "boxyctl run \\-d \\-\\- ./long\\-job; boxyctl attach ID",
    "run in the background, then take over its terminal",
    ".SH SEE ALSO",
    ".BR bwrap (1),",
    ".BR systemd-run (1),",
    ".BR git-config (1)",
    "",
]


def main(argv: list[str]) -> int:
    what = argv[0] if argv else ""
    text = {"bash": bash, "zsh": zsh, "fish": fish, "man": man}.get(what)
    if text is None:
        print(f"usage: python -m boxyctl.completion {'|'.join((*SHELLS, 'man'))}", file=sys.stderr)
        return 2
    sys.stdout.write(text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
