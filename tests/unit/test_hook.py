"""boxyctl.hookpolicy: which command lines are intercepted, the profile, and the
rewritten line (it must give `sh -c` the agent's line byte for byte)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from boxyctl import hookpolicy as hp

CONFIG = hp.HookConfig()
BOXYCTL = "/opt/boxy bin/boxyctl"  # a space: the path is quoted too


def rewritten(line: str, config: hp.HookConfig = CONFIG, **kw: str) -> list[str] | None:
    d = hp.decide(line, config, **kw)
    return None if d is None else shlex.split(hp.wrap(line, d, config, BOXYCTL))


@pytest.mark.parametrize(
    ("line", "profile"),
    [
        ("npm install", "node"),
        ("npx create-vite@latest app", "node"),
        ("pnpm i --frozen-lockfile", "node"),
        ("yarn", "node"),
        ("pip install requests", "python"),
        ("pip3 install -r requirements.txt", "python"),
        ("python -m pip install x", "python"),
        ("python3.12 -I -m pip install x", "python"),
        ("python3 -mpip list", "python"),
        ("uv sync", "python"),
        ("poetry install", "python"),
        ("make -j4", None),
        ("cargo build --release", None),
        ("go test ./...", None),
        ("/usr/bin/npm ci", "node"),
        ("./node_modules/.bin/yarn", "node"),
        ("NODE_ENV=production npm run build", "node"),
        ("env -i PATH=/usr/bin npm test", "node"),
        ("env -u HOME -- npm test", "node"),
        ("nice -n 10 make", None),
        ("timeout -s KILL 60 cargo test", None),
        ("command npm --version", "node"),
        ("exec uv run pytest", "python"),
        ("git status && npm test", "node"),
        ("cd web; yarn build", "node"),
        ("ls | xargs -n1 npm view", "node"),
        ("(cd sub && poetry install)", "python"),
        ("{ make; }", None),
        ("echo $(npm -v)", "node"),
        ('echo "version: $(pip --version)"', "python"),
        ("echo `cargo --version`", None),
        ("sh -c 'npm install'", "node"),
        ('bash -lc "cd x && uv sync"', "python"),
        ("eval 'npm ci'", "node"),
        ("if true; then npm test; fi", "node"),
        ("for d in a b; do make -C $d; done", None),
        ("true &&\nnpm test", "node"),
        ("ls \\\n && npm test", "node"),
        ("2>/dev/null npm test", "node"),
        ("npm test 2>&1 | tee log", "node"),
        ("pip install x && npm ci", "python"),  # the first intercepted program's
    ],
)
def test_intercepted(line: str, profile: str | None) -> None:
    d = hp.decide(line, CONFIG)
    assert d is not None, line
    assert d.profile == profile


@pytest.mark.parametrize(
    "line",
    [
        "ls -la",
        'echo "make it so"',
        "echo npm",
        "grep -r pip .",
        "cat Makefile > make.log",
        "echo hi # && npm install",  # a comment
        "ls > npm",  # a redirection's target
        "boxyctl run -- npm install",  # already sandboxed
        "boxy run -p node -- yarn",
        "echo '$(npm i)'",  # single quotes: no substitution
        "grep -r 'npm i' . | head",  # plain programs' arguments
        "sed -n '10,20p' README.md",  # sed that cannot execute (no `e`)
        "sed -i 's/foo/bar/g' a.py",
        "git -c user.name=x commit -m 'fix the tests'",  # a key git does not run
        "mkdir -p src/{a,b} && git add src/{a,b}.js",  # braces that make no listed name
        "X=1 git status",
        "",
        "   ",
    ],
)
def test_not_intercepted(line: str) -> None:
    assert hp.decide(line, CONFIG) is None, hp.programs(line)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("git commit -m 'npm install'", "npm"),  # git can run an argument (-c alias.x=!…)
        ("python3 script.py", "python3"),  # runs what a sandboxed install wrote
        ("python -m venv .venv", "python"),
        ("pytest -q", "pytest"),
        ("sh script.sh", "*"),  # a shell reading its commands from a file
        ("setsid npm i", "npm"),
        ("echo 'npm i' | sh", "*"),
        ("`echo npm` i", "npm"),  # what a plain program prints may become a command
        ("./scripts/test.sh", "test.sh"),  # the project's own: a sandboxed run may have
        ("node_modules/.bin/eslint .", "eslint"),  # written it
    ],
)
def test_intercepted_as_widely_as_the_shell_runs(line: str, why: str) -> None:
    d = hp.decide(line, CONFIG)
    assert d is not None and why in d.programs, (line, d)


def test_programs_in_order() -> None:
    assert hp.programs("A=1 npm i | tr a b; exit 3") == ["npm", "tr", "exit"]
    assert hp.programs("python -m pip install x") == [hp.PYTHON_PIP]
    assert hp.programs("nice -n 5 ionice -c 3 make") == ["make"]
    assert hp.programs("sh -c 'cd x && make'") == ["sh", "cd", "make"]


def test_unsplittable_line() -> None:
    """An open quote: sh would refuse it too, but a listed name in it is wrapped
    (the sandbox's sh then says what is wrong), and "*" wraps it whatever it is."""
    assert hp.programs("echo 'open") == [hp.UNSPLIT]
    assert hp.decide("npm i 'open", CONFIG) is not None
    assert hp.decide("echo 'open", CONFIG) is None
    assert hp.decide("echo 'open", hp.HookConfig(intercept=("*",))) is not None


@pytest.mark.parametrize("line", ["P=npm; $P install", "$(which npm) ci", '"${NPM:-npm}" i'])
def test_program_named_at_run_time_is_intercepted(line: str) -> None:
    d = hp.decide(line, CONFIG)
    assert d is not None and "*" in d.programs
    assert "an unparsed line" not in hp.reason(d)


def test_deep_nesting_is_intercepted() -> None:
    line = "ls"
    for _ in range(8):
        line = f"sh -c {shlex.quote(line)}"
    assert hp.decide(line, CONFIG) is not None


def test_everything_but_passthrough() -> None:
    config = hp.HookConfig(intercept=("*",), passthrough=("git", "ls"))
    assert hp.decide("rm -rf build", config) is not None
    assert hp.decide("curl -s http://x", config) is not None
    assert hp.decide("git status", config) is None
    assert hp.decide("git status | ls", config) is None
    assert hp.decide("git status && rm x", config) is not None
    assert hp.decide("boxyctl ps", config) is None  # never nested in a sandbox


def test_passthrough_wins_and_intercept_replaces() -> None:
    assert hp.decide("make", hp.HookConfig(passthrough=("make",))) is None
    config = hp.HookConfig(intercept=("rm",))
    assert hp.decide("npm i", config) is None
    assert hp.decide("rm -rf x", config) is not None


def test_profiles_configurable() -> None:
    config = hp.HookConfig(profiles={**hp.DEFAULT_PROFILES, "make": "offline"})
    d = hp.decide("make", config)
    assert d is not None and d.profile == "offline"


def test_approved_project_chooses() -> None:
    """The approved .boxy.yaml's profile, passed as -p: a file removed or swapped
    before the run reads it gets that profile, never the default (attack finding F2)."""
    d = hp.decide("npm i", CONFIG, approved="offline")
    assert d is not None and d.profile == "offline" and d.project
    got = hp.wrap("npm i", d, CONFIG, BOXYCTL)
    assert shlex.split(got)[2:4] == ["-p", "offline"]
    assert "approved .boxy.yaml, profile offline" in hp.reason(d)


@pytest.mark.parametrize(
    "line",
    [
        "npm --version | tr a-z A-Z; exit 3",
        "npm run build -- --mode='prod dev' \"$HOME\" 'it'\"'\"'s'",
        "make CFLAGS=\"-O2 -g\" 2>&1 | grep -v '^#' > out.log",
        "npm test\nnpm run lint",
        "pip install 'requests>=2' && echo \"done: $?\"",
        "cargo build; echo $'tab\\there' `date` \\\\",
        "npm i ünïcødé '\x01'",
    ],
)
def test_rewrite_round_trips(line: str) -> None:
    argv = rewritten(line)
    assert argv is not None
    assert argv[0] == BOXYCTL and argv[1] == "run"
    assert argv[-4:] == ["--", "sh", "-c", line]


def test_rewrite_flags_and_shell() -> None:
    config = hp.HookConfig(flags=("--net", "none"), shell="bash")
    assert rewritten("npm ci", config) == [
        BOXYCTL, "run", "-p", "node", "--net", "none", "--", "bash", "-c", "npm ci",
    ]  # fmt: skip
    assert rewritten("make", config) == [
        BOXYCTL,
        "run",
        "--net",
        "none",
        "--",
        "bash",
        "-c",
        "make",
    ]


def test_rewrite_keeps_the_exit_status_and_pipes() -> None:
    """The rewritten line, run by a real sh with `boxyctl run` replaced by `env`,
    behaves as the agent's line did."""
    line = "printf 'a b\\n' | tr a-z A-Z; exit 3"
    argv = rewritten(line, hp.HookConfig(intercept=("tr",)))
    assert argv is not None
    r = subprocess.run(["env", *argv[argv.index("--") + 1 :]], capture_output=True)
    assert (r.returncode, r.stdout) == (3, b"A B\n")


def test_tokenize() -> None:
    toks = hp.tokenize("a 'b c' \"d $(e f)\" g\\ h|i 2>&1")
    assert [(t.text, t.kind) for t in toks] == [
        ("a", "word"), ("b c", "word"), ("d $(e f)", "word"), ("g h", "word"),
        ("|", "op"), ("i", "word"), (">&", "redir"), ("1", "word"),
    ]  # fmt: skip
    assert toks[2].subs == ["e f"]
    with pytest.raises(ValueError):
        hp.tokenize('echo "open')


def test_a_quarantine_turns_the_answer_into_a_question_to_the_user() -> None:
    event = hp.Event("/w", {"command": "npm i", "description": "d"})
    allow = hp.allow(event, "boxyctl run -- sh -c 'npm i'", "why")
    got = hp.told(allow, ["session ab12: quarantined /w/.mcp.json (Claude Code starts …)"])
    out = got["hookSpecificOutput"]
    assert isinstance(out, dict)
    assert out["permissionDecision"] == "ask"
    assert "quarantined /w/.mcp.json" in str(out["permissionDecisionReason"])
    assert out["updatedInput"] == {"command": "boxyctl run -- sh -c 'npm i'", "description": "d"}
    bare = hp.told(None, ["x" * 5000])["hookSpecificOutput"]
    assert isinstance(bare, dict) and "updatedInput" not in bare
    assert len(str(bare["permissionDecisionReason"])) < hp.TOLD_MAX + 400
