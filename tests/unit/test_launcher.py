"""boxyctl's own scripts (boxyctl/launcher.py): python -S, the package's directory on
sys.path, the full site only for what needs more than the standard library."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from boxyctl import launcher

ROOT = Path(__file__).resolve().parents[2]
# what a run loads, in the order the scripts load it
RUN_PATH = (
    "import sys; sys.path.append({root!r}); "
    "from boxyctl import launcher, main, cli; "
    "c = cli.parse(['run', '--net', 'none', '--', 'true'], "
    "environ={{'HOME': '/h'}}, cwd='/w'); c.args['request'].to_wire(); "
    "from boxy import client, outcome, buildid, varlink; buildid.build_id(); "
)


def _scripts(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    assert launcher.main([str(bin_dir)]) == 0
    return bin_dir


def _run(argv: list[str], cwd: Path, input: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "XDG_RUNTIME_DIR": str(cwd / "run")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, input=input)


def test_the_scripts_start_without_site_and_find_the_package(tmp_path: Path) -> None:
    bin_dir = _scripts(tmp_path)
    assert sorted(os.listdir(bin_dir)) == ["boxy", "boxy-sh", "boxyctl"]
    text = (bin_dir / "boxyctl").read_text()
    assert text.splitlines()[0] == f"#!{sys.executable} -S"
    assert f"sys.path.append({str(ROOT)!r})" in text
    assert os.access(bin_dir / "boxyctl", os.X_OK)
    # --version needs the full site (not a run): it still works, and its line is
    # flushed before the script leaves without the interpreter's teardown
    out = _run([str(bin_dir / "boxy"), "--version"], tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("boxy ") and out.stderr == ""


def test_a_bad_run_is_one_line_and_exit_2_through_the_script(tmp_path: Path) -> None:
    out = _run([str(_scripts(tmp_path) / "boxyctl"), "run", "--bogus", "--", "true"], tmp_path)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == "boxyctl: --bogus: unknown flag\n"


def _bare(code: str) -> str:
    """What CODE prints in an interpreter started as the scripts start it (-S)."""
    return subprocess.run(
        [sys.executable, "-S", "-c", code], cwd="/", capture_output=True, text=True, check=True
    ).stdout


def test_the_run_path_needs_nothing_but_the_standard_library() -> None:
    """What -S leaves out is never needed by a run: every module it loads is the
    standard library's or ours, and none of what was cut from its start-up."""
    code = RUN_PATH.format(root=str(ROOT)) + (
        "ours = ('boxy', 'boxyctl', '__main__'); "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] not in "
        "(*sys.stdlib_module_names, *ours)))); "
        "print(' '.join(sorted(m for m in ('site', 'typing', 'pathlib', 'socket', 're', "
        "'json', 'signal', 'ipaddress', 'dataclasses', 'subprocess') if m in sys.modules)))"
    )
    assert _bare(code) == "\n\n"


def test_what_a_run_imports_before_it_is_sent_leaves_out_what_its_replies_need(
    tmp_path: Path,
) -> None:
    """The call goes out before the reply types load (they load while boxyd works):
    nothing on the way to the send imports enum, contextlib, functools or collections."""
    code = (
        f"import sys; sys.path.append({str(ROOT)!r}); "
        "from boxyctl import launcher, main, cli; "
        "c = cli.parse(['run', '--net', 'none', '--', 'true'], "
        "environ={'HOME': '/h'}, cwd='/w'); wire = c.args['request'].to_wire(); "
        "from boxy import client, buildid, paths, varlink; buildid.build_id(); "
        f"paths.ensure_private_dir({str(tmp_path / 'run')!r}); "
        "varlink.encode({'method': 'dev.boxy.Manager.Run', 'parameters': wire}); "
        "a, b = __import__('_socket').socketpair(); varlink.send_with_fds(a, b'x', [0]); "
        "print(varlink.recv_with_fds(b)[0], "
        "*sorted(m for m in ('enum', 'contextlib', 'functools', 'collections', 'array', "
        "'boxy.outcome') if m in sys.modules))"
    )
    assert _bare(code) == "b'x'\n"


def test_ensure_site_sets_up_what_minus_s_left_out() -> None:
    """PyYAML lives in site-packages: importable only once ensure_site has run."""
    code = (
        f"import sys; sys.path.append({str(ROOT)!r}); "
        "from boxyctl.fullsite import ensure_site\n"
        "try:\n import yaml\nexcept ImportError:\n print('no yaml')\n"
        "ensure_site(); ensure_site(); import yaml; print('yaml', 'site' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd="/", capture_output=True, text=True, check=True
    )
    assert out.stdout.split("\n") == ["no yaml", "yaml True", ""]


def test_the_hook_reads_its_yaml_through_the_script(tmp_path: Path) -> None:
    """`hook claude` starts without site too; a hook.yaml loads (and a bad one is
    still its one line), a line that is not intercepted gets no answer."""
    bin_dir = _scripts(tmp_path)
    config = tmp_path / "config" / "boxy"
    config.mkdir(parents=True)
    (config / "hook.yaml").write_text("passthrough: [ls]\n")
    event = '{"hook_event_name": "PreToolUse", "tool_name": "Bash", "cwd": "/", '
    event += '"tool_input": {"command": "ls -l"}}'
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    argv = [str(bin_dir / "boxyctl"), "hook", "claude"]
    out = _run(["env", *(f"{k}={v}" for k, v in env.items()), *argv], tmp_path, input=event)
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")
    (config / "hook.yaml").write_text("passthrough: [ls\n")
    out = _run(["env", *(f"{k}={v}" for k, v in env.items()), *argv], tmp_path, input=event)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("boxyctl: ") and "not valid YAML" in out.stderr
    assert len(out.stderr.splitlines()) == 1


def test_main_refuses_anything_but_a_bin_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert launcher.main([]) == 2
    assert launcher.main([str(tmp_path / "missing")]) == 2
    assert "usage: python -m boxyctl.launcher BIN_DIR" in capsys.readouterr().err


def test_the_signal_shim_is_the_signal_module_by_number() -> None:
    """boxyctl.sig: the numbers, handlers and timer of the signal module, and its names."""
    import signal

    from boxyctl import sig

    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGALRM", "SIGCONT", "ITIMER_REAL"):
        assert getattr(sig, name) == int(getattr(signal, name))
    assert sig.default_int_handler() is signal.default_int_handler
    got: list[int] = []
    before = sig.signal(sig.SIGALRM, lambda n, _f: got.append(n))
    try:
        sig.setitimer(sig.ITIMER_REAL, 0.01)
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == [signal.SIGALRM]
    finally:
        sig.setitimer(sig.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)  # type: ignore[arg-type]
    assert (sig.name(15), sig.name(1), sig.name(999)) == ("SIGTERM", "SIGHUP", "signal 999")
