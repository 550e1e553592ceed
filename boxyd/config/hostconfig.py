"""The places in your home directory whose files a program on the host obeys unasked
(pure: paths in, verdicts out): the shell runs its rc files at every start, ssh the
ProxyCommand of ~/.ssh/config at every connection, the desktop the .desktop files of
~/.local/share/applications, a shell a program of ~/.local/bin in place of the
system's. A writable tree (-w, --rw, --mkdir, a profile's filesystem.rw and mkdir)
that is one of them, lies inside one or holds one would let the payload make your
machine run a command later, so it is refused unless the run says so with
``--allow-host-config PATH`` (config/filesystem.py, README "Files host programs obey
are held"). The project's own such files (.claude/, .envrc, .npmrc …) are held in
every run instead (config/hostrun.py); ~/.config, boxy's state, your systemd user
units and ~/.claude are refused without a way round (config/exposure.py
settings_paths).

The members come from each tool's own documentation (the FILES section of its manual,
or its documentation's page on configuration), named beside each group below.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Place:
    path: str  # absolute, as the home directory and the environment name it
    tool: str  # who obeys it, for the user
    runs: str  # what that tool does with it

    def why(self) -> str:
        return f"{self.tool} {self.runs}"


def _each(tool: str, runs: str, *names: str) -> list[tuple[str, str, str]]:
    return [(name, tool, runs) for name in names]


# relative to the home directory
HOME: tuple[tuple[str, str, str], ...] = (
    # ssh_config(5): ProxyCommand, LocalCommand, KnownHostsCommand, Match exec, Include;
    # sshd(8) FILES: ~/.ssh/rc at each login, ~/.ssh/environment, authorized_keys'
    # command= and environment= options
    *_each(
        "ssh and sshd",
        "run the commands its config names (ProxyCommand, LocalCommand, Match exec), "
        "its rc at each login, and take authorized_keys and environment",
        ".ssh",
    ),
    # bash(1) INVOCATION and FILES; Debian's and Ubuntu's ~/.bashrc sources ~/.bash_aliases;
    # readline(3) INITIALIZATION FILE: a key bound to a macro types a command
    *_each("bash", "runs it in every interactive shell", ".bashrc", ".bash_aliases"),
    *_each("bash", "runs it at each login", ".bash_profile", ".bash_login"),
    *_each("sh and bash", "run it at each login", ".profile"),
    *_each("bash", "runs it at each logout", ".bash_logout"),
    *_each("readline", "types the commands its key bindings name into your shell", ".inputrc"),
    # zsh(1) STARTUP/SHUTDOWN FILES ($ZDOTDIR: ZDOT below)
    # ksh(1) and mksh(1): $ENV's default; tcsh(1) FILES
    *_each("ksh and mksh", "run it in every interactive shell", ".kshrc", ".mkshrc"),
    *_each("tcsh and csh", "run it in every shell", ".tcshrc", ".cshrc"),
    *_each("tcsh and csh", "run it at each login or logout", ".login", ".logout"),
    # Xsession(5), xinit(1), startx(1), the display managers (GDM, LightDM, SDDM: ~/.xprofile)
    *_each(
        "your graphical login",
        "runs it at each start of a session",
        ".xprofile",
        ".xsession",
        ".xsessionrc",
        ".xinitrc",
        ".xserverrc",
        ".Xclients",
    ),
    # pam_env.conf(5): user_readenv (LD_PRELOAD included)
    *_each("pam_env", "puts it into the environment of each login", ".pam_environment"),
    # forward(5): "|command" lines; procmail(1)
    *_each("the mail system", "runs the commands it names when mail arrives", ".forward"),
    *_each("procmail", "runs the commands its recipes name", ".procmailrc"),
    # file-hierarchy(7): ~/.local/bin is on $PATH; Debian's ~/.profile puts ~/bin there too
    *_each(
        "your shell",
        "runs a program there in place of the system's of the same name (it is on your PATH)",
        ".local/bin",
        "bin",
    ),
    # Python's site module: the .pth files of the user site-packages run at each start
    *_each("Python", "runs the .pth files of its user site-packages at every start", ".local/lib"),
    # git-config(1) FILES (~/.config/git is under ~/.config)
    *_each(
        "git",
        "runs the programs its keys name (core.pager, core.fsmonitor, aliases, core.hooksPath)",
        ".gitconfig",
    ),
    # installers that put their bin on PATH or have your shell's rc source their script:
    # rustup (~/.cargo/env, ~/.cargo/bin), nvm, pyenv, rbenv, SDKMAN!, asdf, Volta, Deno,
    # Bun, Go (GOPATH's bin); cargo's own config(5) (runner, rustc-wrapper)
    *_each(
        "your shell",
        "runs the programs there (your shell's rc puts them on PATH)",
        ".cargo/bin",
        ".deno/bin",
        ".bun/bin",
        "go/bin",
        ".volta",
    ),
    *_each("your shell", "sources it at every start (rustup)", ".cargo/env"),
    *_each(
        "cargo", "runs its runner, rustc-wrapper and aliases", ".cargo/config.toml", ".cargo/config"
    ),
    *_each("rustup", "runs the toolchains it holds as cargo and rustc", ".rustup"),
    *_each(
        "your shell",
        "sources its scripts at every start and runs the programs it holds",
        ".nvm",
        ".pyenv",
        ".rbenv",
        ".sdkman",
        ".asdf",
    ),
    # the package managers' per-user configuration (npmrc(5), yarn's and bun's docs,
    # pip's "Configuration" (legacy ~/.pip), setuptools' ~/.pydistutils.cfg, conda,
    # gem(1), Bundler's config, Maven's settings and ~/.mavenrc, Gradle's init scripts
    # and gradle.properties, sbt's global plugins)
    *_each("npm", "runs what its settings say (node-options, script-shell, git)", ".npmrc"),
    *_each("yarn", "runs what its settings say (yarnPath, plugins)", ".yarnrc", ".yarnrc.yml"),
    *_each("bun", "loads the preload scripts it names", ".bunfig.toml"),
    *_each("pip and setuptools", "install from where it says", ".pip", ".pydistutils.cfg"),
    *_each("conda", "installs from the channels it names", ".condarc"),
    *_each("gem", "installs from the sources it names", ".gemrc"),
    *_each("Bundler", "installs from the sources and paths it names", ".bundle"),
    *_each(
        "Maven",
        "takes its mirrors and extensions from it",
        ".m2/settings.xml",
        ".m2/extensions.xml",
    ),
    *_each("mvn", "sources it at every start", ".mavenrc"),
    *_each(
        "Gradle",
        "runs its init scripts and the JVM it names in every build",
        ".gradle/init.d",
        ".gradle/init.gradle",
        ".gradle/init.gradle.kts",
        ".gradle/gradle.properties",
    ),
    *_each("sbt", "loads its global plugins and settings", ".sbt"),
    # docker config.json credsStore/credHelpers (docker-credential-*), cli-plugins;
    # kubeconfig users[].exec; the AWS CLI's credential_process
    *_each("docker", "runs the credential helpers it names", ".docker/config.json"),
    *_each("docker", "runs them as its subcommands", ".docker/cli-plugins"),
    *_each("kubectl", "runs the exec credential plugins it names", ".kube/config"),
    *_each("the AWS CLI", "runs its credential_process", ".aws/config"),
    # editors, terminal multiplexers, consoles and debuggers: their startup files
    *_each(
        "Vim",
        "runs it (and the plugins it holds) at every start",
        ".vimrc",
        ".gvimrc",
        ".exrc",
        ".vim",
    ),
    *_each("Emacs", "runs it at every start", ".emacs", ".emacs.el", ".emacs.d"),
    *_each("VS Code", "loads the extensions it holds", ".vscode", ".vscode-server"),
    *_each("tmux", "runs its run-shell and if-shell commands", ".tmux.conf"),
    *_each("screen", "runs the commands it names", ".screenrc"),
    *_each("gdb and lldb", "run it at every start", ".gdbinit", ".lldbinit"),
    *_each(
        "interactive consoles",
        "run it at every start",
        ".pdbrc",
        ".irbrc",
        ".pryrc",
        ".Rprofile",
        ".psqlrc",
        ".sqliterc",
    ),
    *_each("IPython and Jupyter", "run their startup files and configs", ".ipython", ".jupyter"),
    *_each("mail readers", "run the commands it names for a type", ".mailcap", ".muttrc"),
    # agent harnesses' user configuration (MCP servers they start, hooks they run)
    *_each("Claude Code", "starts the MCP servers it names", ".claude.json"),
    *_each(
        "agent harnesses",
        "start the MCP servers and run the hooks they name",
        ".gemini",
        ".codex",
        ".cursor",
        ".qwen",
        ".continue",
        ".codeium",
        ".kiro",
        ".copilot",
        ".factory",
    ),
    *_each("Aider", "runs its lint-cmd and test-cmd", ".aider.conf.yml"),
)

# zsh(1) STARTUP/SHUTDOWN FILES, in $ZDOTDIR (the home directory unless set)
ZDOT: tuple[str, ...] = (".zshenv", ".zprofile", ".zshrc", ".zlogin", ".zlogout")

# relative to $XDG_DATA_HOME (~/.local/share): the Desktop Entry Specification's
# applications (Exec=, and the programs mimeapps.list opens files with), GNOME Shell's
# extensions, KDE's service menus and Plasma's widgets
DATA: tuple[tuple[str, str, str], ...] = (
    *_each(
        "your desktop",
        "runs the Exec= of its .desktop files and opens files with the programs they name",
        "applications",
    ),
    *_each("GNOME Shell", "loads its extensions at each login", "gnome-shell/extensions"),
    *_each(
        "KDE",
        "runs its service menus and loads its widgets",
        "kservices5",
        "kio/servicemenus",
        "plasma",
    ),
)


def places(home: str, envs: Iterable[Mapping[str, str]]) -> list[Place]:
    """Every place of the class for HOME, as each environment of ENVS (the client's,
    boxyd's own) and the default place them; an empty list without a home."""
    if not home.startswith("/") or home == "/":
        return []
    out = [Place(posixpath.join(home, rel), tool, runs) for rel, tool, runs in HOME]
    datas, zdots = {posixpath.join(home, ".local/share")}, {home}
    for env in envs:
        data, zdot = env.get("XDG_DATA_HOME", ""), env.get("ZDOTDIR", "")
        datas |= {data} if data.startswith("/") else set()
        zdots |= {zdot} if zdot.startswith("/") else set()
    for zdot in sorted(zdots):
        out += [Place(posixpath.join(zdot, n), "zsh", "runs it at every start") for n in ZDOT]
    for data in sorted(datas):
        out += [Place(posixpath.join(data, rel), tool, runs) for rel, tool, runs in DATA]
    unique: dict[str, Place] = {}
    for p in out:
        unique.setdefault(posixpath.normpath(p.path), p)
    return list(unique.values())


def _contains(tree: str, path: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def resolver(realpath: Callable[[str], str] = os.path.realpath) -> Callable[[str], str]:
    """realpath, but an absent path is its parent's resolved (memoised: the places
    share a few parents) plus its name: a run looks at a hundred places, most of them
    absent, and each realpath walks every component."""
    memo: dict[str, str] = {}

    def real(path: str) -> str:
        path = posixpath.normpath(path)
        got = memo.get(path)
        if got is None:
            parent = posixpath.dirname(path)
            if parent == path or os.path.lexists(path):
                got = realpath(path)
            else:
                got = posixpath.join(real(parent), posixpath.basename(path))
            memo[path] = got
        return got

    return real


Resolved = list[tuple[Place, frozenset[str]]]


def resolved(known: Iterable[Place], real: Callable[[str], str] | None = None) -> Resolved:
    """Each place with the forms it is compared in: as given and as REAL resolves it
    (a dotfile manager's ~/.bashrc is a symlink into a repository)."""
    real = real or resolver()
    return [(p, frozenset({posixpath.normpath(p.path), real(p.path)})) for p in known]


def touched(
    tree: str, known: Resolved, real: Callable[[str], str] | None = None
) -> list[tuple[str, Place]]:
    """The places of KNOWN (resolved) TREE is, lies in or holds, with the verb that
    says which ("is", "lies in", "holds"), compared as given and as REAL resolves it
    (the repository ~/.bashrc links into holds it)."""
    real = real or resolver()
    trees = {posixpath.normpath(tree), real(tree)}
    out = []
    for place, forms in known:
        if trees & forms:
            out.append(("is", place))
        elif any(_contains(f, t) for t in trees for f in forms):
            out.append(("lies in", place))
        elif any(_contains(t, f) for t in trees for f in forms):
            out.append(("holds", place))
    return out
