"""Registry hosts are read from the tools' configuration; the template → host logic."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from boxyd.config import hosttools
from boxyd.config.hosttools import Answer, Exposure
from boxyd.config.registries import Registries, host_of
from tests.harness import toolshed


@pytest.mark.parametrize(
    ("value", "host"),
    [
        ("https://registry.example.test/", "registry.example.test"),
        ("http://mirror.example.test:8080/npm/\n", "mirror.example.test"),
        ("https://proxy.example.test,direct", "proxy.example.test"),
        ("https://proxy.example.test|https://other.example.test", "proxy.example.test"),
        ("sum.example.test", "sum.example.test"),
        ("off", None),
        ("direct", None),
        ("", None),
        ("https://", None),
        ("http://[::1", None),
    ],
)
def test_host_of(value: str, host: str | None) -> None:
    assert host_of(value) == host


class Tools:
    """What the tools would print; records what was asked."""

    def __init__(self, answers: dict[str, str | None]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def __call__(self, argv: list[str]) -> str | None:
        key = " ".join(argv[:3]) if argv[0] != "python3" or argv[1] == "-m" else "pip-defaults"
        self.asked.append(key)
        return self.answers.get(key)


DEFAULTS = "index=https://index.example.test/simple\nfiles=files.example.test\n"


def test_npm_from_tool_and_cached() -> None:
    tools = Tools({"npm config get": "registry=https://npm.example.test/\ncafile=null\n"})
    reg = Registries({}, run=tools)
    assert reg("npm_registry") == "npm.example.test"
    assert reg("npm_registry") == "npm.example.test"
    assert reg("npm_cafile") is None
    assert tools.asked == ["npm config get", "npm config get"]  # one question each, no more


def test_env_override_wins_without_asking() -> None:
    tools = Tools({})
    reg = Registries({"npm_config_registry": "https://mirror.example.test/npm/"}, run=tools)
    assert reg("npm_registry") == "mirror.example.test"
    assert tools.asked == []


def test_pip_default_index_and_files() -> None:
    tools = Tools({"pip-defaults": DEFAULTS})
    reg = Registries({}, run=tools)
    assert reg("pip_index") == "index.example.test"
    assert reg("pip_files") == "files.example.test"
    assert reg("pip_index_url") is None
    assert reg("pip_cert") is None
    assert tools.asked == ["pip-defaults"] * 4  # one python start-up each (then cached)


def test_pip_private_index_serves_its_own_files(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    private = "global.index-url=https://devpi.example.test/root/simple\n"
    tools = Tools({"pip-defaults": DEFAULTS + private + f"global.cert={ca}\n"})
    reg = Registries({}, run=tools)
    assert reg("pip_index") == "devpi.example.test"
    assert reg("pip_files") == "devpi.example.test"
    assert reg("pip_index_url") == "https://devpi.example.test/root/simple"
    assert reg("pip_cert") == str(ca)


def test_missing_tool_gives_none() -> None:
    reg = Registries({}, run=Tools({}))
    assert reg("npm_registry") is None
    assert reg("go_proxy") is None
    assert reg("no_such_template") is None


@pytest.mark.parametrize(
    ("value", "shaped"),
    [
        ("https://mirror.example.test/npm/", "https://mirror.example.test/npm/"),
        ("https://user:tok@mirror.example.test/", None),  # credentials never enter the sandbox
        ("ftp://mirror.example.test/", None),
        ("not a url", None),
    ],
)
def test_registry_urls_without_credentials(value: str, shaped: str | None) -> None:
    reg = Registries({"npm_config_registry": value}, run=Tools({}))
    assert reg("npm_registry_url") == shaped


def test_ca_files_must_exist(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    tools = Tools({"npm config get": f"registry=https://npm.example.test/\ncafile={ca}"})
    assert Registries({}, run=tools)("npm_cafile") == str(ca)
    assert Registries({}, run=Tools({"npm config get": "cafile=null"}))("npm_cafile") is None
    assert (
        Registries({"PIP_CERT": str(tmp_path / "missing.pem")}, run=Tools({}))("pip_cert") is None
    )


class Counting:
    """A real tool sandbox (tests/harness/toolshed.py) that counts the calls made in it."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, exposure: Exposure) -> hosttools.Box:
        box = toolshed.opener()(exposure)
        calls = self.calls

        class Box:
            def run(self, argv: Sequence[str], **kw: Any) -> Answer:
                calls.append(list(argv))
                return box.run(argv, **kw)

            def close(self) -> None:
                box.close()

        return Box()


def _stand_in(tmp_path: Path, name: str, lines: list[str]) -> dict[str, str]:
    """A real executable NAME on PATH that prints LINES: the environment to find it."""
    tool = tmp_path / name
    tool.write_text("#!/bin/sh\n" + "".join(f"echo {line}\n" for line in lines))
    tool.chmod(0o755)
    return {"PATH": f"{tmp_path}:/usr/bin:/bin", "HOME": str(tmp_path)}


def _asked_again_once(
    env: dict[str, str], tools: Counting, config: Path, name: str, answer: str
) -> None:
    """A config file the answer named appears (or changes): asked again at once, once."""
    asked = len(tools.calls)
    config.write_text("[global]\nregistry = https://other.example.test/\n")
    assert Registries(env, tools=tools)(name) == answer  # the stand-in's
    assert len(tools.calls) == asked + 1
    assert Registries(env, tools=tools)(name) == answer
    assert len(tools.calls) == asked + 1


def test_the_tools_answer_is_kept_across_runs(tmp_path: Path) -> None:
    # One Registries per run; asking npm costs a node start-up, so the answer is
    # kept for the next runs. A real executable stands in for npm here.
    npmrc = tmp_path / ".npmrc"
    env = _stand_in(
        tmp_path,
        "npm",
        ["registry=https://cached.example.test/", "cafile=null", f"userconfig={npmrc}",
         f"globalconfig={tmp_path}/etc/npmrc"],
    )  # fmt: skip
    tools = Counting()
    assert Registries(env, tools=tools)("npm_registry") == "cached.example.test"
    assert Registries(env, tools=tools)("npm_registry_url") == "https://cached.example.test/"
    assert Registries(env, tools=tools)("npm_cafile") is None
    # one node start-up for every npm setting, and none for the next runs
    npm = str(tmp_path / "npm")
    assert tools.calls == [
        [npm, "config", "get", "registry", "cafile", "userconfig", "globalconfig"]
    ]
    _asked_again_once(env, tools, npmrc, "npm_registry", "cached.example.test")


def test_pips_answer_is_kept_while_its_config_files_are_as_they_were(tmp_path: Path) -> None:
    # python with pip costs a start-up of its own (~0.15 s) for the settings of every
    # pip run: kept while the config files pip named are unchanged, not a minute
    conf = tmp_path / "pip.conf"
    env = _stand_in(
        tmp_path,
        "python3",
        ["index=https://index.example.test/simple", "files=files.example.test",
         "file=/nonexistent/pip.conf", f"file={conf}"],
    )  # fmt: skip
    tools = Counting()
    assert Registries(env, tools=tools)("pip_index") == "index.example.test"
    assert Registries(env, tools=tools)("pip_files") == "files.example.test"
    assert len(tools.calls) == 1
    _asked_again_once(env, tools, conf, "pip_index", "index.example.test")


def test_a_tool_in_a_writable_tree_is_never_asked(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".venv/bin").mkdir(parents=True)
    planted = project / ".venv/bin/npm"
    planted.write_text("#!/bin/sh\necho registry=https://planted.example.test/\n")
    planted.chmod(0o755)
    env = {"PATH": f"{planted.parent}:/nonexistent", "HOME": str(tmp_path)}
    tools = Counting()
    reg = Registries(env, tools=tools, writable=[str(project)])
    assert reg("npm_registry") is None
    assert tools.calls == []
    assert reg.notes == ["npm: not found outside the writable trees; its settings were not asked"]
