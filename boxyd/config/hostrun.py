"""Files a host program obeys unasked (pure: paths in, verdicts out): the project
files through which a tool on the host runs a command, starts a server, chooses a
program or widens its own permissions when the user runs it for another purpose, or
when it merely starts or enters the directory (docs/design.md, "Files the host runs").

Reporting such a file is no defence: the line at the end of a run is read by an agent,
and the tool has already obeyed it by the time anyone reads it. So every run holds
them (boxyd/daemon/liveguard.py, boxyd/plan/worktree.py):

- one present at the start is **pinned** read-only (a directory whole);
- one the payload creates anyway (it was absent, or a symlink stood there) is
  **quarantined** at once by the live guard, the earlier entry put back; the check
  after the run is the backstop;
- ``--edit-config PATH`` leaves one writable for a run meant to change it (recorded).

The members come from each tool's own documentation (README, "Files host tools obey"):

- **agent harnesses**: Claude Code's ``.claude/`` (hooks, status line, permissions,
  commands, agents, skills) and ``.mcp.json`` (MCP servers it starts), Cursor's,
  Gemini CLI's, Codex's, Windsurf's, Roo's, Cline's, Continue's, Kiro's, Amazon Q's,
  opencode's and Zed's project directories, Aider's config (``lint-cmd``,
  ``test-cmd``);
- **editors**: ``.vscode/`` (tasks run on folder open, settings naming programs, MCP
  servers), ``*.code-workspace``, ``.idea/``, ``.fleet/``, dev containers
  (``initializeCommand`` runs on the host), Vim's and Neovim's ``exrc`` files,
  Emacs's ``.dir-locals.el``;
- **environment loaders run on cd** and version files that choose the program a
  command runs: direnv, mise, asdf, zsh-autoenv, nvm/fnm, pyenv, rbenv, jenv, goenv,
  sdkman;
- **git hook managers** whose configuration the installed hooks read at every commit:
  husky, pre-commit, lefthook, overcommit, simple-git-hooks, lint-staged, commitlint;
- **package managers and build tools**: ``.npmrc``, ``.yarnrc``, ``.yarnrc.yml``,
  ``pnpm-workspace.yaml``, ``pip.conf``/``pip.ini`` (judged by the keys that run
  something: toolconfig.py; one that holds none is left alone), ``.pnpmfile.cjs``,
  ``yarn.config.cjs``, yarn's ``releases``/``plugins``/``sdks``, ``bunfig.toml``
  (preloads), ``uv.toml``, ``poetry.toml``, cargo's config (``runner``,
  ``rustc-wrapper``), rustup's toolchain file (``path``), Maven's ``.mvn/``, the
  Gradle wrapper's properties and ``gradle.properties`` (``org.gradle.java.home``),
  Bundler's config.

Not held, and said in the README: what the user runs knowingly (``package.json``'s
scripts, a Makefile: reported as before, execfiles.py), instructions an agent reads
(``CLAUDE.md``, ``AGENTS.md``), and what an install writes by design (``node_modules``,
a venv, ``.pnp.cjs``), which host programs then run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum


class Judge(Enum):
    ANY = "any"  # whatever it holds: a new one is quarantined
    KEYS = "keys"  # only while it holds a key that runs something (toolconfig.TOOLS)
    # a version file: only while it names a path (a program of its own choosing), not
    # a version among those installed (`uv init`, `pyenv local` write those)
    PATH = "path"
    # a directory on the way to a PATHS entry: only while it is a symlink (to the
    # payload's directory, which the tool would read as its own: LINKS)
    SYMLINK = "symlink"


@dataclass(frozen=True)
class Held:
    tool: str  # who obeys it, for the user
    runs: str  # what that tool does with it
    judge: Judge = Judge.ANY

    def why(self) -> str:
        return f"{self.tool} {self.runs}"


# a directory the payload made that its owner cannot list: what is in it cannot be
# judged, and host programs open the names in it they know without listing it
UNREADABLE = Held("boxy", "cannot look into it (a directory you cannot list)")


def _held(tool: str, runs: str, *names: str, judge: Judge = Judge.ANY) -> dict[str, Held]:
    return dict.fromkeys(names, Held(tool, runs, judge))


# by name, at any depth: a tool started in a subdirectory (a package of a monorepo)
# reads that directory's own; a directory is held whole
NAMES: dict[str, Held] = {
    # agent harnesses
    **_held(
        "Claude Code",
        "runs its hooks, status line and commands, and takes its permissions from it",
        ".claude",
    ),
    **_held("Claude Code", "starts the MCP servers it names", ".mcp.json"),
    **_held("Cursor", "starts its MCP servers and runs its hooks", ".cursor"),
    **_held("Gemini CLI", "starts its MCP servers and runs its hooks", ".gemini"),
    **_held("Qwen Code", "starts its MCP servers and runs its hooks", ".qwen"),
    **_held("Codex", "starts its MCP servers and takes its settings from it", ".codex"),
    **_held("Windsurf", "runs its workflows and hooks", ".windsurf"),
    **_held("Roo Code", "takes its modes and MCP servers from it", ".roo", ".roomodes"),
    **_held("Cline", "runs its hooks and takes its rules from it", ".clinerules"),
    **_held("Continue", "starts its MCP servers", ".continue"),
    **_held("Kiro", "runs its hooks and starts its MCP servers", ".kiro"),
    **_held("Amazon Q", "starts its MCP servers", ".amazonq"),
    **_held(
        "opencode",
        "starts its MCP servers and loads its plugins",
        "opencode.json",
        "opencode.jsonc",
        ".opencode",
    ),
    **_held("Aider", "runs its lint-cmd and test-cmd", ".aider.conf.yml"),
    **_held(
        "Kilo Code",
        "starts its MCP servers",
        ".kilocode",
        ".kilo",
        "kilo.json",
        "kilo.jsonc",
    ),
    **_held("Crush", "starts its MCP and language servers", "crush.json", ".crush.json", ".crush"),
    **_held(
        "agent harnesses",
        "start the MCP servers and run the hooks they name",
        ".junie",
        ".factory",
        ".augment",
        ".trae",
        ".qoder",
        ".iflow",
        ".amp",
    ),
    # editors
    **_held("Zed", "runs its tasks and language servers", ".zed"),
    **_held("Helix", "runs the language servers and formatters it names", ".helix"),
    **_held(
        "VS Code", "runs its tasks on folder open and the programs its settings name", ".vscode"
    ),
    **_held("JetBrains IDEs", "run its run configurations and startup tasks", ".idea", ".fleet"),
    **_held(
        "dev containers",
        "run its initializeCommand on the host",
        ".devcontainer",
        ".devcontainer.json",
    ),
    **_held(
        "Vim and Neovim",
        "run it as an exrc file",
        ".nvim.lua",
        ".nvimrc",
        ".exrc",
        ".vimrc",
        ".lvimrc",
    ),
    **_held("Emacs", "evaluates its local variables", ".dir-locals.el", ".dir-locals-2.el"),
    **_held("Neovim (lazy.nvim)", "runs it as a local spec", ".lazy.lua"),
    **_held("Theia", "runs its tasks and launch configurations", ".theia"),
    **_held("Kate", "runs the build commands it names", ".kateproject"),
    **_held("Eclipse", "runs its external tool builders", ".externalToolBuilders"),
    **_held("rust-analyzer", "runs the commands its settings name", "rust-analyzer.toml"),
    **_held("Haskell's language server", "runs its cradle's program on open", "hie.yaml"),
    **_held("build-server clients (Metals, IntelliJ)", "start the argv it names", ".bsp"),
    # environment loaders and version files
    **_held("direnv", "runs it when you enter the directory", ".envrc"),
    **_held("autoenv", "runs it when you leave the directory", ".env.leave"),
    **_held("zsh-autoenv", "runs it on cd", ".autoenv.zsh", ".autoenv_leave.zsh"),
    **_held(
        "mise",
        "runs its hooks, tasks and env scripts",
        "mise.toml",
        ".mise.toml",
        "mise.local.toml",
        ".mise.local.toml",
        ".mise",
    ),
    **{
        name: Held("version managers", "run the program a path in it names", Judge.PATH)
        for name in (
            ".tool-versions",
            ".nvmrc",
            ".node-version",
            ".python-version",
            ".ruby-version",
            ".java-version",
            ".go-version",
            ".sdkmanrc",
            "rust-toolchain",
            "rust-toolchain.toml",
            ".bazelversion",  # `fork/version`: Bazelisk downloads the fork's
            ".pdm-python",
            "global.json",  # .NET's sdk.paths
        )
    },
    **_held("devbox", "runs its init_hook", "devbox.json"),
    **_held(
        "rbenv-vars and nodenv-vars",
        "put it into every command's environment",
        ".rbenv-vars",
        ".nodenv-vars",
    ),  # fmt: skip
    **_held("RVM", "runs it (and its env-*) on cd", ".rvmrc", ".versions.conf"),
    **_held("Shadowenv", "runs its programs on cd", ".shadowenv.d"),
    **_held("proto", "installs from the plugins it names", ".prototools"),
    **_held("cabal", "builds with the compiler it names", "cabal.project.local"),
    # git hook managers (the hooks installed in .git/hooks read these at each commit)
    **_held(
        "husky",
        "runs its hooks at each commit",
        ".husky",
        ".huskyrc",
        *(f".huskyrc.{ext}" for ext in ("json", "js", "cjs", "yaml", "yml")),
    ),
    **_held(
        "pre-commit",
        "runs the hooks it names at each commit",
        ".pre-commit-config.yaml",
        ".pre-commit-config.yml",
    ),
    **_held("hk", "runs the hooks it names at each commit", "hk.pkl", "hk.local.pkl"),
    **_held("CaptainHook", "runs the actions it names at each commit", "captainhook.json"),
    **_held("GrumPHP", "runs its tasks at each commit", "grumphp.yml", "grumphp.yml.dist"),
    **_held("rusty-hook", "runs its hooks at each commit", ".rusty-hook.toml", "rusty-hook.toml"),
    **_held(
        "nano-staged",
        "runs the commands it names at each commit",
        *(f".nano-staged.{ext}" for ext in ("json", "js", "cjs", "mjs")),
        *(f"nano-staged.{ext}" for ext in ("json", "js", "cjs", "mjs")),
    ),
    **_held(
        "lefthook",
        "runs the commands it names at each commit",
        *(
            f"{dot}lefthook{local}.{ext}"
            for dot in ("", ".")
            for local in ("", "-local")
            for ext in ("yml", "yaml", "json", "jsonc", "toml")
        ),
        ".lefthook",
        ".lefthook-local",
    ),
    **_held(
        "overcommit", "runs the hooks it names at each commit", ".overcommit.yml", ".git-hooks"
    ),
    **_held(
        "simple-git-hooks",
        "runs the commands it names at each commit",
        *(f"{dot}simple-git-hooks.{ext}" for dot in ("", ".") for ext in ("json", "js", "cjs")),
    ),
    **_held(
        "lint-staged",
        "runs the commands it names at each commit",
        ".lintstagedrc",
        *(
            f".lintstagedrc.{ext}"
            for ext in ("json", "yaml", "yml", "mjs", "mts", "js", "ts", "cjs", "cts")
        ),
        *(f"lint-staged.config.{ext}" for ext in ("js", "mjs", "cjs", "ts", "mts", "cts")),
    ),
    **_held(
        "commitlint",
        "loads it at each commit",
        ".commitlintrc",
        *(
            f"{base}.{ext}"
            for base in (".commitlintrc", "commitlint.config")
            for ext in ("json", "yaml", "yml", "js", "cjs", "mjs", "ts", "cts", "mts")
        ),
    ),
    # package managers and build tools
    # judged by their keys: plan/toolconfig.py's TOOLS (a unit test holds the two equal)
    **{
        name: Held(tool, "runs or installs what its settings say", Judge.KEYS)
        for name, tool in (
            (".npmrc", "npm"),
            (".yarnrc", "yarn"),
            (".yarnrc.yml", "yarn"),
            ("pnpm-workspace.yaml", "pnpm"),
            ("pip.conf", "pip"),
            ("pip.ini", "pip"),
        )
    },
    **_held("pnpm", "runs it on every install", ".pnpmfile.cjs", ".pnpmfile.mjs"),
    **_held("yarn", "runs it (constraints)", "yarn.config.cjs"),
    **_held("yarn", "puts it into the environment of every script", ".env.yarn"),
    **_held("bun", "loads the preload scripts it names", "bunfig.toml"),
    **_held("uv", "installs from the indexes and interpreters it names", "uv.toml"),
    **_held("Poetry", "uses the virtualenv it names", "poetry.toml"),
    **_held("PDM", "uses the interpreter and virtualenv it names", "pdm.toml"),
    **_held("Maven", "loads its extensions and JVM options", ".mvn"),
    **_held("Gradle", "runs with the JVM it names", "gradle.properties"),
    **_held("sbt", "passes it to the JVM (-javaagent runs code)", ".jvmopts", ".sbtopts"),
    **_held("Bazel", "takes its options (and Bazelisk its download URL) from it", ".bazelrc"),
    **_held("Bazelisk", "downloads the Bazel it names", ".bazeliskrc"),
    **_held("pdb", "runs its commands at every start", ".pdbrc"),
    # interactive consoles and debuggers that run a file of the current directory
    **_held("the Perl debugger", "runs it at every start", ".perldb"),
    **_held("IEx", "evaluates it at every start", ".iex.exs"),
    **_held("GHCi", "runs it at every start", ".ghci"),
    **_held("R", "runs it (and takes its environment) at every start", ".Rprofile", ".Renviron"),
    **_held("Octave", "runs it at every start", ".octaverc"),
    **_held("irb and Pry", "run it at every start", ".irbrc", ".pryrc"),
    **_held(
        "sbt and Mill", "pass it to the JVM or run it", ".sbtrc", ".mill-jvm-opts", ".mill-opts"
    ),
}

# by the path's last parts, at any depth
PATHS: dict[tuple[str, ...], Held] = {
    **{
        tuple(p.split("/")): h
        for p, h in {
            ".yarn/releases": Held("yarn", "runs the release it holds as yarn itself"),
            ".yarn/plugins": Held("yarn", "loads its plugins"),
            ".yarn/sdks": Held("editors", "run yarn's SDKs (tsserver, eslint)"),
            ".cargo/config.toml": Held("cargo", "runs its runner, rustc-wrapper and aliases"),
            ".cargo/config": Held("cargo", "runs its runner, rustc-wrapper and aliases"),
            ".config/mise": Held("mise", "runs its hooks, tasks and env scripts"),
            ".config/mise.toml": Held("mise", "runs its hooks, tasks and env scripts"),
            "mise/config.toml": Held("mise", "runs its hooks, tasks and env scripts"),
            "mise/config.local.toml": Held("mise", "runs its hooks, tasks and env scripts"),
            ".config/mise.local.toml": Held("mise", "runs its hooks, tasks and env scripts"),
            ".github/hooks": Held("VS Code's agent", "runs its hooks"),
            ".bundle/config": Held("Bundler", "installs from the sources and paths it names"),
            "tools/bazel": Held("Bazelisk", "runs it instead of Bazel"),
            "gradle/wrapper/gradle-wrapper.properties": Held(
                "the Gradle wrapper", "downloads and runs the distribution it names"
            ),
            "gradle/gradle-daemon-jvm.properties": Held(
                "Gradle", "downloads and runs the JVM it names"
            ),
        }.items()
    },
}

# by the name's ending, at any depth
SUFFIXES: dict[str, Held] = {
    ".code-workspace": Held("VS Code", "runs its tasks and the programs its settings name"),
    ".sublime-project": Held("Sublime Text", "runs its build systems"),
}

# node_modules is an install's output (README: what this does not cover); .git is the
# git guard's (credentials.SKIP_DIRS: a unit test holds the two equal)
SKIP_DIRS = frozenset({"node_modules", ".git"})
_LONGEST = max(len(k) for k in PATHS)

# What a symlink may stand in for: each directory on the way to a PATHS entry (`.cargo`
# for .cargo/config.toml; `gradle` and `gradle/wrapper`), by the path's last parts.
LINKS: dict[tuple[str, ...], Held] = {}
for _key, _held_path in PATHS.items():
    for _n in range(1, len(_key)):
        LINKS.setdefault(
            _key[:_n],
            Held(
                _held_path.tool,
                f"would read {'/'.join(_key)} through it (a symlink in place of a directory)",
                Judge.SYMLINK,
            ),
        )


def match(rel: str) -> Held | None:
    """What holds the entry REL of a writable tree itself (not through a held directory
    above it: ``held_above``), or None."""
    parts = rel.split("/")
    if not parts[-1] or not SKIP_DIRS.isdisjoint(parts):
        return None
    name = parts[-1]
    held = NAMES.get(name)
    if held is not None:
        return held
    for n in range(2, min(_LONGEST, len(parts)) + 1):
        held = PATHS.get(tuple(parts[-n:]))
        if held is not None:
            return held
    for suffix, held in SUFFIXES.items():
        if name.endswith(suffix) and name != suffix:
            return held
    return None


def as_link(rel: str) -> Held | None:
    """What holds the entry REL when it is a symlink: one in place of a directory on
    the way to a PATHS entry (LINKS), or None."""
    parts = rel.split("/")
    if not parts[-1] or not SKIP_DIRS.isdisjoint(parts):
        return None
    for n in range(1, min(_LONGEST, len(parts)) + 1):
        held = LINKS.get(tuple(parts[-n:]))
        if held is not None:
            return held
    return None


def held_above(rel: str) -> str | None:
    """The nearest strict ancestor of REL that is held (a held directory holds all
    beneath it), or None."""
    parts = rel.split("/")
    for n in range(len(parts) - 1, 0, -1):
        up = "/".join(parts[:n])
        if match(up) is not None:
            return up
    return None


def held_as(rel: str, via: str = "", *, link: bool = False) -> tuple[Held, str] | None:
    """What holds the entry REL (reached VIA a held entry, when it was: the target of a
    held symlink, another name of a held file; LINK: REL is a symlink), and the name it
    is judged as (a package manager's config keeps its tool's name), or None."""
    held = match(rel) or (as_link(rel) if link else None)
    if held is not None:
        return held, rel.rpartition("/")[2]
    if not via:
        return None
    held = match(held_above(via) or via) or as_link(via)
    if held is not None and held.judge is Judge.SYMLINK:  # what the symlink led to
        held = Held(held.tool, held.runs)
    return (held, via.rpartition("/")[2]) if held is not None else None


def edited(rel: str, edit: Iterable[str]) -> bool:
    """REL is left to the run by --edit-config (EDIT: rels of held entries in the same
    tree, config/filesystem.py checks that): named by one, or beneath one."""
    return any(rel == e or rel.startswith(e + "/") for e in edit)
