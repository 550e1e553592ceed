"""Which of an agent's shell command lines run sandboxed, and how: pure, no I/O.

A command line is split as sh splits it (tokenize: quotes, backslashes, comments;
shlex's splitter cannot tell a quoted '|' from a pipe) into simple commands (at `|`,
`&&`, `||`, `;`, `&`, newlines, subshells, `$(…)` and backticks); each one's program
is its first word after assignments (`VAR=value`) and wrappers (`env`, `nice`, …).
A line is intercepted when any program is on the intercept list and not on the
passthrough list; then the whole line runs as `boxyctl run … -- sh -c LINE` (quoted
as shlex quotes), so its quoting, pipes and exit status are the shell's own (README,
"Agents (Claude Code)").
"""

from __future__ import annotations

import os

# Neither json, shlex nor re on the hook's path (it runs before every command an agent
# types: bench/hook.py): json's own C scanner (boxy/wirejson.py), shlex's quoting
# (boxyctl/shellquote.py) and the few patterns below as plain string tests
from boxy import wirejson
from boxyctl import shellquote

NODE = ("npm", "npx", "pnpm", "pnpx", "yarn", "yarnpkg", "bun", "bunx", "corepack")
PYTHON = ("pip", "pip3", "pipx", "uv", "uvx", "poetry", "pdm", "hatch", "tox", "nox", "pip -m")
BUILD = (
    "make", "gmake", "cmake", "ninja", "meson", "cargo", "go", "gradle", "gradlew",
    "mvn", "mvnw", "ant", "sbt", "bundle", "gem", "rake", "composer", "dotnet",
    "swift", "mix", "rebar3", "cabal", "stack", "deno",
)  # fmt: skip
# interpreters and test runners: they run what a sandboxed install just wrote
# (node_modules, a venv's site-packages, conftest.py), in the default profile
RUNNERS = (
    "node", "nodejs", "python", "python3", "pytest", "py.test", "jest", "vitest",
    "mocha", "tsx", "ts-node",
)  # fmt: skip
DEFAULT_INTERCEPT = (*NODE, *PYTHON, *BUILD, *RUNNERS)
# `python -m pip …` is named as this program (no real program has a space in it)
PYTHON_PIP = "pip -m"
DEFAULT_PROFILES = {**dict.fromkeys(NODE, "node"), **dict.fromkeys(PYTHON, "python")}
# never wrapped, whatever the lists say: a line already headed for a sandbox
OURS = ("boxyctl", "boxy", "boxy-sh")
UNSPLIT = "?"  # programs() of a line that does not split
ON_UNAVAILABLE = ("deny", "ask")

# words that open a command without being its program
_KEYWORDS = frozenset(
    ("if", "then", "elif", "else", "fi", "do", "done", "while", "until", "for", "case",
     "esac", "!", "{", "}", "time", "in", "function", "select", "coproc")
)  # fmt: skip
# wrapper → its options that take a value (the wrapper's program comes after them)
_WRAPPERS: dict[str, frozenset[str]] = {
    "env": frozenset(("-u", "--unset", "-C", "--chdir", "-S", "--split-string")),
    "command": frozenset(),
    "builtin": frozenset(),
    "exec": frozenset(("-a",)),
    "nohup": frozenset(),
    "nice": frozenset(("-n", "--adjustment")),
    "ionice": frozenset(("-c", "-n", "--class", "--classdata")),
    "stdbuf": frozenset(("-i", "-o", "-e")),
    "timeout": frozenset(("-s", "--signal", "-k", "--kill-after")),
    "xargs": frozenset(("-a", "-d", "-E", "-I", "-L", "-n", "-P", "-s", "--delimiter")),
    "chronic": frozenset(),
}
_SHELLS = frozenset(("sh", "bash", "dash", "zsh", "ksh", "mksh", "busybox"))
# builtins that run what a file says: a shell reading its commands from elsewhere
_SOURCES = frozenset(("source", "."))
# Programs whose arguments are never run (README, "Agents"): a listed name among them
# is data (`echo npm`, `grep -r pip .`). Not git, find, xargs, sort (its
# --compress-program), sed (GNU `e`), awk, rg (--pre): each can run an argument.
# Not cp, mv, ln or install either: each makes a program a name of its own (`ln -s
# /usr/bin/npm x`), so what they copy is judged by its name.
PLAIN = frozenset(
    ("echo", "printf", "cat", "ls", "head", "tail", "wc", "grep", "egrep", "fgrep",
     "pwd", "cd", "true", "false", "test", "[", "which", "type", "file", "stat", "du",
     "df", "basename", "dirname", "realpath", "readlink", "diff", "cut", "tr", "uniq",
     "mkdir", "touch", "rm", "rmdir", "chmod", "tee", "exit")
)  # fmt: skip
# Programs that run code they may compute (a name built at run time is no word on the
# line: `perl -e 'system(reverse "i mpn")'`), or read from a file: always wrapped
# ("*"), as a shell reading from elsewhere is. sed too when its script may execute
# (GNU `e`: _sed_runs).
_COMPUTES = frozenset(
    ("perl", "ruby", "php", "lua", "luajit", "tclsh", "wish", "expect", "awk", "gawk",
     "mawk", "nawk", "Rscript", "julia", "pwsh", "osascript", "guile", "racket",
     "parallel", "gdb", "vim", "vi", "nvim", "ex", "ed", "emacs")
)  # fmt: skip
# Variables through which the next program runs what the line does not name (the
# shells' startup files, the program search path, the dynamic loader, the runtimes'
# preloads): assigning one makes the command "*".
_RUNS_VIA = frozenset(
    ("PATH", "BASH_ENV", "ENV", "PROMPT_COMMAND", "BASH_LOADABLES_PATH", "LD_PRELOAD",
     "LD_LIBRARY_PATH", "LD_AUDIT", "NODE_OPTIONS", "NODE_PATH", "PYTHONPATH",
     "PYTHONSTARTUP", "PERL5OPT", "PERL5LIB", "RUBYOPT", "RUBYLIB")
)  # fmt: skip
_DECLARES = frozenset(("export", "declare", "typeset", "local", "readonly"))
# git's keys whose value is a command it runs (git-config(1)): `git -c` with one of
# these (or an alias.*) runs what the line may not name
_GIT_RUNS = (
    "alias.", "core.pager", "core.editor", "core.sshcommand", "core.fsmonitor",
    "core.hookspath", "core.askpass", "sequence.editor", "pager.", "diff.external",
    "gpg.", "credential.", "filter.", "diff.", "merge.", "interactive.difffilter",
    "uploadpack.packobjectshook", "remote.", "url.", "include", "protocol.",
)  # fmt: skip
_FIND_EXEC = frozenset(("-exec", "-execdir", "-ok", "-okdir"))
_BRACE_MAX = 256  # words one brace expansion may make before the word counts as "*"
# what splits a word into the pieces a shell (brace expansion, an option's value, a
# PATH-like list, a line fed to a shell later) may run as a program of their own
_PIECE_SEPARATORS = " \t\n;&|(){}<>,=:!@'\"`"
_GLOB = frozenset("*?[")
# where programs that are not the project's live: one named by another path (./x.sh,
# node_modules/.bin/jest) may be what a sandboxed run wrote
_SYSTEM = ("/usr/", "/bin/", "/sbin/", "/lib/", "/opt/", "/nix/", "/snap/")
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_NAME_REST = _NAME_START | frozenset("0123456789")
_VERSION = frozenset("0123456789.")
_MAX_DEPTH = 4  # `sh -c "sh -c …"`: deeper than this is intercepted outright


class _Value:
    """Compared and shown by its fields. (Not a dataclass: the module costs the hook,
    which runs before every command, 20 ms.)"""

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({vars(self)!r})"


class HookConfig(_Value):
    """The user's choice (hook.yaml). INTERCEPT: program names, or "*" for every
    command; PASSTHROUGH wins over it; PROFILES: program → profile; FLAGS: added to
    every `boxyctl run`; ON_UNAVAILABLE: boxyd out of reach → "deny", or "ask" (no
    decision: the harness asks as usual)."""

    def __init__(
        self,
        intercept: tuple[str, ...] = DEFAULT_INTERCEPT,
        passthrough: tuple[str, ...] = (),
        profiles: dict[str, str] | None = None,
        flags: tuple[str, ...] = (),
        shell: str = "sh",
        on_unavailable: str = "deny",
    ) -> None:
        self.intercept, self.passthrough, self.flags = intercept, passthrough, flags
        self.profiles = dict(DEFAULT_PROFILES) if profiles is None else profiles
        self.shell, self.on_unavailable = shell, on_unavailable


class Decision(_Value):
    """An intercepted line: the programs that made it so, and the profile (None: the
    daemon's choice, i.e. the approved project's, or the default). PROJECT: the
    project's approved .boxy.yaml chooses the profile."""

    def __init__(
        self, programs: tuple[str, ...], profile: str | None, project: bool = False
    ) -> None:
        self.programs, self.profile, self.project = programs, profile, project


def programs(line: str, depth: int = 0) -> list[str]:
    """The program of every simple command in LINE, in order. A line that does not
    split (an open quote) gives [UNSPLIT]; a program named at run time is "*"."""
    try:
        tokens = tokenize(line)
    except ValueError:
        return [UNSPLIT]
    out: list[str] = []
    redirect = False  # the next word is a redirection's target
    words: list[str] = []
    for tok in tokens:
        if tok.kind == "redir":
            redirect = True
        elif tok.kind == "op":
            out += _program(words, depth)
            words = []
        else:
            for inner in tok.subs:
                out += _inner(inner, depth)
            if redirect:
                redirect = False
            else:
                words.append(tok.text)
    return out + _program(words, depth)


class Token:
    """A word (its text unquoted, and the command lines of its quoted `$(…)` and
    backticks), a control operator ("op") or a redirection ("redir")."""

    def __init__(self, text: str, kind: str = "word", subs: list[str] | None = None) -> None:
        self.text, self.kind, self.subs = text, kind, subs or []

    def __repr__(self) -> str:
        return f"Token({self.text!r}, {self.kind!r}, {self.subs!r})"


_OPS = "\n;&|()`"
_REDIR = "<>"


def tokenize(line: str) -> list[Token]:
    """LINE as the shell splits it into words and operators (quotes, backslashes,
    comments); an open quote is a ValueError, as it is a syntax error to sh."""
    out: list[Token] = []
    word: list[str] | None = None  # None: between words
    subs: list[str] = []
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c in " \t" or c in _OPS or c in _REDIR:
            if word is not None:
                out.append(Token("".join(word), subs=subs))
                word, subs = None, []
            if c in " \t":
                i += 1
                continue
            j = i
            while j < n and (line[j] in _OPS or line[j] in _REDIR):
                j += 1
            run = line[i:j]
            # `<(…)`, `>(…)`: a process substitution opens a command, not a redirection
            kind = "redir" if any(x in run for x in _REDIR) and "(" not in run else "op"
            if kind == "redir" and out and out[-1].text.isdigit() and line[i - 1].isdigit():
                out.pop()  # `2>`: the fd is the redirection's, not a word
            out.append(Token(run, kind))
            i = j
            continue
        if c == "#" and word is None:
            i = line.find("\n", i)
            i = n if i < 0 else i
            continue
        word = [] if word is None else word
        i = _word_part(line, i, word, subs)
    if word is not None:
        out.append(Token("".join(word), subs=subs))
    return out


def _word_part(line: str, i: int, word: list[str], subs: list[str]) -> int:
    """One piece of a word at I (a quoted string, an escaped character, a plain
    one) appended to WORD; returns where the next piece starts."""
    c = line[i]
    if c == "\\":
        if line[i + 1 : i + 2] != "\n":  # backslash-newline joins lines
            word.append(line[i + 1 : i + 2])
        return i + 2
    if c == "'":
        end = line.find("'", i + 1)
        if end < 0:
            raise ValueError("no closing quotation")
        word.append(line[i + 1 : end])
        return end + 1
    if c != '"':
        word.append(c)
        return i + 1
    j = i + 1
    raw: list[str] = []
    while j < len(line) and line[j] != '"':
        if line[j] == "\\" and j + 1 < len(line):
            raw.append(line[j : j + 2])
            word.append(line[j + 1] if line[j + 1] in '"\\$`' else line[j : j + 2])
            j += 2
            continue
        raw.append(line[j])
        word.append(line[j])
        j += 1
    if j >= len(line):
        raise ValueError("no closing quotation")
    subs += _substitutions("".join(raw))
    return j + 1


def _substitutions(text: str) -> list[str]:
    """The command lines of the `$(…)` and backticks in double-quoted TEXT."""
    out = []
    start, end = text.find("$("), text.rfind(")")
    if start >= 0 and start + 2 <= end:  # from the first `$(` to the last `)`, as sh nests
        out.append(text[start + 2 : end])
    return out + text.split("`")[1::2]


def is_assignment(word: str) -> bool:
    """WORD starts a shell assignment: NAME= or NAME+= (ASCII NAME, not a digit first)."""
    eq = word.find("=")
    name = word[: eq - 1] if eq > 0 and word[eq - 1] == "+" else word[:eq]
    return eq > 0 and bool(name) and name[0] in _NAME_START and _NAME_REST.issuperset(name)


def is_python(name: str) -> bool:
    """python, python3, python3.11 … (what `python -m pip` is run as)."""
    return name.startswith("python") and _VERSION.issuperset(name[6:])


def _program(words: list[str], depth: int) -> list[str]:
    """The program of one simple command (WORDS), after assignments, keywords and
    wrappers; a shell's `-c LINE` and `eval` are looked into."""
    i = 0
    while i < len(words):
        w = words[i]
        if is_assignment(w) or w in _KEYWORDS:
            i += 1
            continue
        if "$" in w or "`" in w:
            return ["*"]  # named at run time (`$P i`, `$(which npm) i`): not known here
        name = os.path.basename(w)
        if name in _WRAPPERS:
            i = _after_options(words, i + 1, _WRAPPERS[name], name)
            continue
        rest = words[i + 1 :]
        if name == "eval":
            return _inner(" ".join(rest), depth)
        inner = _shell_command(rest) if name in _SHELLS else None
        if inner is not None:
            return [name, *_inner(inner, depth)]
        if is_python(name) and _runs_pip(rest):
            return [PYTHON_PIP]
        return [name]
    return []


def _shell_command(args: list[str]) -> str | None:
    """A shell's command string: the first operand after an option with c in it
    (`-c`, `-lc`, `-ec`)."""
    has_c = False
    for a in args:
        if a.startswith("-") and not a.startswith("--"):
            has_c = has_c or "c" in a
        elif not a.startswith("--"):
            return a if has_c else None
    return None


def _inner(line: str, depth: int) -> list[str]:
    return programs(line, depth + 1) if depth < _MAX_DEPTH else ["*"]


def _after_options(words: list[str], i: int, valued: frozenset[str], wrapper: str) -> int:
    """The index of the wrapped program: past WRAPPER's options (and their values),
    env's assignments and timeout's duration."""
    while i < len(words) and words[i].startswith("-") and words[i] != "-":
        opt = words[i]
        i += 2 if opt in valued else 1
        if opt == "--":
            break
    if wrapper == "timeout" and i < len(words):
        i += 1  # the duration
    return i


def _runs_pip(args: list[str]) -> bool:
    """`python -m pip`, `-mpip`, `-I -m pip`, `-X dev -m pip` …"""
    skip = False
    for i, a in enumerate(args):
        if skip:  # the value of -X or -W
            skip = False
            continue
        if a in ("-m", "-Im", "-Em") and args[i + 1 : i + 2] in (["pip"], ["pip3"]):
            return True
        if a in ("-mpip", "-mpip3"):
            return True
        if not a.startswith("-"):
            return False
        skip = a in ("-X", "-W")
    return False


def anywhere(line: str, config: HookConfig) -> list[str]:
    """The conservative rule (README, "Agents"): the intercepted names that appear as
    a word anywhere in LINE, after quote and escape removal, split as a shell may
    split them again (`env -S 'npm i'`, `echo 'npm i' | sh`, `{npm,} i`, a glob that
    matches one: `/usr/bin/np?`), but where every occurrence is a plain argument of a
    program that runs none of its arguments (PLAIN, or the user's passthrough); a
    word named at run time among the arguments of any other program ("*"); and "*"
    for a shell that reads its commands from elsewhere (stdin, a here-string, a
    process substitution, a file: `sh`, `bash -s`, `source`, `.`)."""
    try:
        tokens = tokenize(line)
    except ValueError:
        return []
    names = frozenset(n for n in config.intercept if " " not in n) - set(config.passthrough)
    plain = PLAIN | frozenset(config.passthrough)
    hits: list[str] = []
    command: list[Token] = []
    quoted = False  # within backticks: what a command prints may become a command
    for tok in [*tokens, Token(";", "op")]:
        if tok.kind == "op":
            hits += _command_hits(command, names, frozenset() if quoted else plain)
            command = []
            quoted ^= tok.text.count("`") % 2 == 1
        else:
            command.append(tok)
        hits += [h for sub in tok.subs for h in anywhere(sub, config)]
    return hits


def _command_hits(tokens: list[Token], names: frozenset[str], plain: frozenset[str]) -> list[str]:
    """One simple command's hits (anywhere)."""
    words, redirect = [], False
    for tok in tokens:
        if tok.kind == "redir":
            redirect = True
            continue
        if not redirect:
            words.append(tok.text)
        redirect = False
    i, hits = 0, []
    while i < len(words) and (is_assignment(words[i]) or words[i] in _KEYWORDS):
        hits += _assignment_hits(words[i], names)
        i += 1
    program = os.path.basename(words[i]) if i < len(words) else ""
    rest = words[i + 1 :]
    if i >= len(words) or program in OURS:
        return hits  # nothing to run; or already headed for a sandbox: its arguments are that run
    if "/" in words[i] and not words[i].startswith(_SYSTEM):
        return [program]  # a program from the project (./x.sh, node_modules/.bin/…)
    if _runs_unseen(words, i, names):
        return ["*"]  # runs what is not on the line: a file, stdin, a computed name
    if program not in plain:
        hits += [h for w in rest for h in _word_hits(w, names, args=True)]
    return [*hits, *_word_hits(words[i], names)]


def _assignment_hits(word: str, names: frozenset[str]) -> list[str]:
    """An assignment (`X=npm`, `PATH=/tmp/x`): "*" for a variable through which a later
    program runs what the line does not name (_RUNS_VIA), else its value's names."""
    if not is_assignment(word):
        return []
    return ["*"] if _runs_via(word) else _word_hits(word, names)


def _runs_via(word: str) -> bool:
    """WORD assigns a _RUNS_VIA variable (`PATH=…`, `LD_PRELOAD+=…`)."""
    return is_assignment(word) and word.split("=", 1)[0].rstrip("+") in _RUNS_VIA


def _runs_unseen(words: list[str], i: int, names: frozenset[str]) -> bool:
    """Whether the command at WORDS[I] runs code the line does not show: a shell or a
    `source` reading a file or stdin, through any wrapper (`xargs sh -c`, `env -S`);
    a program that computes what it runs (_COMPUTES, sed's `e`, a `git -c` command
    key); `xargs`/`find -exec` running the data they read (`-I%`, `{}`); a declared
    _RUNS_VIA variable."""
    chain: list[str] = []
    while i < len(words):
        w = words[i]
        if is_assignment(w):
            if _runs_via(w):
                return True
            i += 1
            continue
        name = os.path.basename(w)
        if name not in _WRAPPERS:
            break
        chain.append(name)
        if name == "xargs" and any(a.startswith(("-I", "-i", "--replace")) for a in words[i:]):
            return True  # the program or its command is made of what it reads
        i = _after_options(words, i + 1, _WRAPPERS[name], name)
    if i >= len(words):
        return False
    name, rest = os.path.basename(words[i]), words[i + 1 :]
    if name in _SOURCES or name in _COMPUTES or name == "sed" and _sed_runs(rest):
        return True
    if name in _SHELLS and (_shell_command(rest) is None or "xargs" in chain):
        return True  # reads its commands from a file or stdin (or xargs' input)
    if name in _DECLARES:
        return any(_runs_via(a) for a in rest)
    if name == "git":
        return _git_runs(rest)
    return name == "find" and _find_runs(rest)


def _sed_runs(args: list[str]) -> bool:
    """Whether sed may execute its pattern space (GNU's `e` command, or the `e` flag of
    `s`): an `e` standing alone after a delimiter, on the side of caution; or a script
    read from a file."""
    import re  # (only for sed)

    if any(a == "-f" or a.startswith(("-f", "--file")) for a in args):
        return True
    scripts = [a.split("=", 1)[1] if a.startswith("--expression=") else a for a in args]
    lone_e = re.compile(r"(?:^|[^A-Za-z])e(?:[^A-Za-z0-9]|$)")
    return any(lone_e.search(a) for a in scripts if not a.startswith("-"))


def _git_runs(args: list[str]) -> bool:
    """`git -c KEY=…` (or --config-env) with a key whose value git runs (_GIT_RUNS)."""
    for j, a in enumerate(args):
        if a == "-c" or a == "--config-env":
            key = args[j + 1].lower() if j + 1 < len(args) else ""
        elif a.startswith(("-c", "--config-env=")):
            key = a.split("=", 1)[1] if a.startswith("--") else a[2:]
            key = key.lower()
        else:
            continue
        if key.startswith(_GIT_RUNS):
            return True
    return False


def _find_runs(args: list[str]) -> bool:
    """find running what it found (`-exec {} …`), or a shell reading elsewhere."""
    for j, a in enumerate(args):
        if a in _FIND_EXEC and j + 1 < len(args):
            program = args[j + 1]
            if "{}" in program:
                return True
            if os.path.basename(program) in _SHELLS and _shell_command(args[j + 2 :]) is None:
                return True
    return False


def _word_hits(word: str, names: frozenset[str], *, args: bool = False) -> list[str]:
    """The names WORD may run as: after brace expansion, split into the pieces a shell
    may run later. ARGS: an argument of a program that may run it, where a shell or a
    _COMPUTES program among the pieces runs what is not seen (`git -c alias.x='!sh'`)."""
    if "$" in word or "`" in word:
        return ["*"]  # named at run time
    words = _braces(word)
    if words is None:
        return ["*"]  # more words than _BRACE_MAX
    out = []
    for piece in (p for w in words for p in _pieces(w)):
        name = os.path.basename(piece)
        if name in names or (is_python(name) and "python" in names):
            out.append(name)
        elif args and (name in _SHELLS or name in _COMPUTES):
            out.append("*")
        elif not _GLOB.isdisjoint(name):
            import fnmatch  # (only for a word with a glob in it: fnmatch imports re)

            out += [n for n in sorted(names) if fnmatch.fnmatchcase(n, name)]
    return out


def _pieces(word: str) -> list[str]:
    pieces = [word]
    for sep in _PIECE_SEPARATORS:
        if sep in word:
            pieces = [p for piece in pieces for p in piece.split(sep)]
    return pieces


def _braces(word: str) -> list[str] | None:
    """WORD's brace expansion as bash makes it (`np{m,x}` is npm and npx, `{l..n}` the
    letters between), the word itself included (a quoted brace is not expanded: the
    superset is asked); None past _BRACE_MAX words."""
    todo, out = [word], [word]
    while todo:
        w = todo.pop()
        got = _expand_first(w)
        if not got:
            continue
        out += got
        todo += got
        if len(out) > _BRACE_MAX:
            return None
    return out


def _expand_first(word: str) -> list[str]:
    """The words of WORD's first brace expression (`pre{a,b}post`, `pre{x..y}post`),
    or [] when it has none."""
    for start in (i for i, c in enumerate(word) if c == "{"):
        depth, commas = 0, []
        for j in range(start, len(word)):
            if word[j] == "{":
                depth += 1
            elif word[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            elif word[j] == "," and depth == 1:
                commas.append(j)
        else:
            return []  # no closing brace: none after it either
        pre, body, post = word[:start], word[start + 1 : j], word[j + 1 :]
        if commas:
            cuts = [start, *commas, j]
            return [pre + word[a + 1 : b] + post for a, b in zip(cuts, cuts[1:], strict=False)]
        seq = _sequence(body)
        if seq is not None:
            return [pre + x + post for x in seq]
    return []


def _sequence(body: str) -> list[str] | None:
    """`x..y` (letters or integers, an increment after a further `..`): its members,
    at most _BRACE_MAX + 1 of them; None if BODY is no sequence."""
    parts = body.split("..")
    if len(parts) not in (2, 3):
        return None
    a, b = parts[0], parts[1]
    if len(a) == len(b) == 1 and a.isalpha() and b.isalpha():
        lo, hi = sorted((ord(a), ord(b)))
        return [chr(c) for c in range(lo, min(hi, lo + _BRACE_MAX) + 1)]
    try:
        lo, hi = sorted((int(a), int(b)))
    except ValueError:
        return None
    return [str(x) for x in range(lo, min(hi, lo + _BRACE_MAX) + 1)]


# boxyctl's subcommands that widen what a sandbox may do: never on the agent's word
# alone, however the harness is configured (an allowed `Bash(boxyctl:*)`, a bypass mode)
WIDENING = ("allow", "trust")


def widens(line: str, depth: int = 0) -> str | None:
    """What in LINE would widen a sandbox, said as its words, or None: boxyctl (boxy)
    followed by `allow` or `trust`, or by a subcommand only known at run time (`$X`,
    a substitution), or given its arguments by xargs. Conservative, as anywhere() is:
    every word counts, wherever it stands (`find -exec`, `env`, `bash -c "…"`, a
    substitution's line), so a wrapper or a quoted line cannot carry it past unasked;
    `echo boxyctl allow` is asked about too. A program named at run time is sandboxed
    by decide(), where boxyctl reaches no boxyd."""
    try:
        tokens = tokenize(line)
    except ValueError:
        return None  # an open quote: the shell refuses it too
    words: list[str] = []
    target = False  # the next word is a redirection's (`boxyctl 2>&1 allow`): no argument
    for tok in tokens:
        if tok.kind == "word" and not target:
            words += tok.text.split()  # a quoted line (`bash -c "…"`) word by word
        target = tok.kind == "redir"
        for inner in tok.subs:
            if depth < _MAX_DEPTH and (found := widens(inner, depth + 1)) is not None:
                return found
    for j, word in enumerate(words):
        if not _may_be(os.path.basename(word), OURS):
            continue
        after = words[j + 1] if j + 1 < len(words) else None
        unseen = after is None and "xargs" in map(os.path.basename, words[:j])
        if (
            unseen
            or after is not None
            and (_may_be(after, WIDENING) or "$" in after or "`" in after)
        ):
            return " ".join(words[j : j + 2])
    return None


def _may_be(word: str, names: tuple[str, ...]) -> bool:
    """WORD is one of NAMES, or may become one when the shell expands it: a glob
    (`boxyct?`, `[a]llow`) or a brace expansion (`{allow,}`, `boxy{ctl,}`), each
    brace group read as any text."""
    if word in names:
        return True
    if not any(c in word for c in "*?[{"):
        return False
    import fnmatch  # (only for a word the shell may expand)
    import re

    pattern = re.sub(r"\{[^{}]*\}", "*", word)
    return any(fnmatch.fnmatchcase(name, pattern) for name in names)


def ask_to_widen(command: str) -> dict[str, object]:
    """The answer to a line that widens a sandbox: the user's, in the harness's prompt."""
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "ask",
            "permissionDecisionReason": (
                f"boxy: `{command}` widens what a sandbox may reach; it runs only if you answer yes"
            ),
        }
    }


def decide(line: str, config: HookConfig, *, approved: str | None = None) -> Decision | None:
    """Whether LINE runs sandboxed, and with which profile: the first intercepted
    program's (PROFILES), unless the project's approved .boxy.yaml chooses: APPROVED,
    the profile it names (boxyd's Trusted), passed as the run's -p so that a file
    changed before the run reads it gets that profile, never the default's."""
    found = programs(line)
    every = "*" in config.intercept
    hits = [
        p
        for p in found
        if p not in config.passthrough
        and p not in OURS
        and (every or p == "*" or p in config.intercept)
    ]
    if found == [UNSPLIT]:  # look for a listed name anywhere in it
        import re  # (only for a line that does not split)

        words = set(re.findall(r"[A-Za-z0-9_.+][A-Za-z0-9_.+-]*", line))
        hits = ["*"] if every or words & set(config.intercept) - set(config.passthrough) else []
    elif not hits and not every:
        hits = [p for p in anywhere(line, config) if p not in OURS]
    if not hits:
        return None
    profile = approved
    if approved is None:
        profile = next((config.profiles[p] for p in hits if p in config.profiles), None)
    return Decision(tuple(dict.fromkeys(hits)), profile, approved is not None)


def wrap(line: str, decision: Decision, config: HookConfig, boxyctl: str) -> str:
    """LINE as one `boxyctl run` command line (for a shell to run): the line itself
    is one quoted argument of `sh -c`, so the sandbox's shell sees it unchanged."""
    argv = [boxyctl, "run"]
    if decision.profile is not None:
        argv += ["-p", decision.profile]
    argv += [*config.flags, "--", config.shell, "-c", line]
    return shellquote.join(argv)


def reason(decision: Decision) -> str:
    """What the harness shows (its debug log, for an allow)."""
    names = ", ".join(
        "a program not known before it runs" if p == "*" else p for p in decision.programs
    )
    how = (
        f"the project's approved .boxy.yaml, profile {decision.profile}"
        if decision.project
        else f"profile {decision.profile or 'generic'}"
    )
    return f"boxy: runs sandboxed ({names}; {how})"


# --- Claude Code's PreToolUse hook: its JSON in and out ----------------------------


class Event(_Value):
    """What the hook needs of Claude Code's PreToolUse input."""

    def __init__(self, cwd: str, tool_input: dict[str, object]) -> None:
        self.cwd, self.tool_input = cwd, tool_input

    @property
    def command(self) -> str:
        return str(self.tool_input["command"])


def parse_event(data: bytes) -> Event | None:
    """Claude Code's hook input: {"session_id", "transcript_path", "cwd",
    "hook_event_name": "PreToolUse", "tool_name", "tool_input": {"command", …}}.
    Anything else is a ValueError naming what is wrong, in one line."""
    try:
        doc = wirejson.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"the hook's input is not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError("the hook's input is not a JSON object")
    for key in ("hook_event_name", "tool_name", "cwd"):
        if not isinstance(doc.get(key), str):
            raise ValueError(f"the hook's input has no {key!r} string")
    if doc["hook_event_name"] != "PreToolUse":
        raise ValueError(f"not a PreToolUse event: {doc['hook_event_name']!r}")
    if doc["tool_name"] != "Bash":
        return None
    tool_input = doc.get("tool_input")
    if not isinstance(tool_input, dict) or not isinstance(tool_input.get("command"), str):
        raise ValueError("the hook's input has no tool_input.command string")
    if not os.path.isabs(doc["cwd"]):
        raise ValueError(f"the hook's cwd is not an absolute path: {doc['cwd']!r}")
    return Event(doc["cwd"], tool_input)


def allow(event: Event, command: str, why: str) -> dict[str, object]:
    """The answer that runs COMMAND in place of the agent's (the rest of its input
    kept: a timeout, run_in_background, the description)."""
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "allow",
            "permissionDecisionReason": why,
            "updatedInput": {**event.tool_input, "command": command},
        }
    }


TOLD_MAX = 2000  # characters of the quarantine's lines one prompt shows (the rest: `show`)


def told(answer: dict[str, object] | None, lines: list[str]) -> dict[str, object]:
    """ANSWER (an allow, or None: no answer) turned into a question to the user, with
    LINES (what boxyd moved to the quarantine since the last answer: boxy/notices.py)
    as its reason: Claude Code shows an ask's reason to the user, in the prompt the
    user must answer, never only to the agent. A rewritten command stays rewritten."""
    text = "\n".join(lines)
    if len(text) > TOLD_MAX:
        text = text[:TOLD_MAX] + "\n… (`boxyctl show ID` has the rest)"
    out: dict[str, object] = {
        "hookEventName": "PreToolUse",
        "permissionDecision": "ask",
        "permissionDecisionReason": (
            "boxy moved to its quarantine files that a sandboxed command wrote and that "
            f"a program on this machine would have run or obeyed:\n{text}\n"
            "Look at them before you go on; answer to run this command."
        ),
    }
    if answer is not None:
        inner = answer["hookSpecificOutput"]
        assert isinstance(inner, dict)
        if "updatedInput" in inner:
            out["updatedInput"] = inner["updatedInput"]
    return {"hookSpecificOutput": out}


def deny(why: str) -> dict[str, object]:
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": why,
        }
    }


# --- Claude Code's settings file: our entry in, or out -----------------------------

HOOK_TIMEOUT = 30  # seconds: the hook itself is quick; this bounds starting boxyd


def is_our_hook(entry: object) -> bool:
    """A hooks[] item that runs `… boxyctl hook claude` (any path to boxyctl)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("command"), str):
        return False
    import shlex  # (installing and removing only)

    try:
        argv = shlex.split(entry["command"])
    except ValueError:
        return False
    return len(argv) == 3 and os.path.basename(argv[0]) in OURS and argv[1:] == ["hook", "claude"]


def _pretooluse(settings: dict[str, object]) -> list[object]:
    """settings.hooks.PreToolUse, checked to be what Claude Code reads (ValueError)."""
    hooks = settings.get("hooks", {})
    if not isinstance(hooks, dict):
        raise ValueError('"hooks" is not an object')
    groups = hooks.get("PreToolUse", [])
    if not isinstance(groups, list):
        raise ValueError('"hooks.PreToolUse" is not a list')
    return groups


def without_hook(settings: dict[str, object]) -> dict[str, object]:
    """SETTINGS with every entry of ours gone (a group or table it emptied too)."""
    groups = _pretooluse(settings)
    kept: list[object] = []
    for group in groups:
        inner = group.get("hooks") if isinstance(group, dict) else None
        if not isinstance(group, dict) or not isinstance(inner, list):
            kept.append(group)
            continue
        mine = [h for h in inner if is_our_hook(h)]
        if not mine:
            kept.append(group)
        elif len(mine) < len(inner):
            kept.append({**group, "hooks": [h for h in inner if not is_our_hook(h)]})
    if kept == groups:
        return settings
    hooks = dict(settings.get("hooks") or {})  # type: ignore[call-overload]
    if kept:
        hooks["PreToolUse"] = kept
    else:
        hooks.pop("PreToolUse", None)
    out = {**settings, "hooks": hooks}
    if not hooks:
        del out["hooks"]
    return out


def with_hook(settings: dict[str, object], command: str) -> dict[str, object]:
    """SETTINGS with our Bash entry (COMMAND) in it once: an old one of ours (another
    path to boxyctl) replaced, every other key as it was."""
    entry = {"type": "command", "command": command, "timeout": HOOK_TIMEOUT}
    ours = [
        (g.get("matcher"), h)
        for g in _pretooluse(settings)
        if isinstance(g, dict) and isinstance(g.get("hooks"), list)
        for h in g["hooks"]
        if is_our_hook(h)
    ]
    if ours == [("Bash", entry)]:
        return settings  # already there, as we would write it
    base = without_hook(settings)
    hooks = dict(base.get("hooks") or {})  # type: ignore[call-overload]
    hooks["PreToolUse"] = [*_pretooluse(base), {"matcher": "Bash", "hooks": [entry]}]
    return {**base, "hooks": hooks}
