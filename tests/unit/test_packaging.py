"""The Debian package's files agree with the tree they package (issue 33 §3), without
building it: CI builds it, installs it and runs the escape suite against that copy
(.ci/run); these catch a template, a completion or a library the package forgot."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from boxy.ident import VERSION
from boxyctl import launcher, userunits
from boxyd.daemon import doctor

ROOT = Path(__file__).resolve().parents[2]
DEBIAN = ROOT / "debian"
RULES = (DEBIAN / "rules").read_text()
PREFIX = "/usr/lib/boxy"
BOXYD = f"{PREFIX}/bin/boxyd"

# the Debian package providing each library boxy loads through ctypes (dh_shlibdeps
# cannot see those), and pyseccomp's
LIBRARIES = {"libnftables.so.1": "libnftables1", "libseccomp.so.2": "libseccomp2"}


def test_the_changelog_names_this_version() -> None:
    first = (DEBIAN / "changelog").read_text().splitlines()[0]
    assert first.startswith(f"boxy ({VERSION}) "), first


def test_rules_renders_every_unit_template_to_the_installed_boxyd(tmp_path: Path) -> None:
    templates = sorted(p.name for p in userunits.SOURCE.iterdir())
    assert templates == sorted([*userunits.UNITS, userunits.DBUS_SERVICE])
    assert (ROOT / "units").resolve() == userunits.SOURCE  # the top-level link
    for name in templates:
        assert f"units/{name}" in RULES or (
            name in userunits.UNITS and "for unit in boxyd.socket boxyd.service" in RULES
        ), name
    assert "s#@BOXYD@#$(PREFIX)/bin/boxyd#" in RULES and "PREFIX := /usr/lib/boxy" in RULES
    # what the package installs makes `boxyctl setup` from it copy nothing
    (tmp_path / "boxyd.service").write_text(userunits.render("boxyd.service", BOXYD))
    assert userunits.packaged(BOXYD, tmp_path)
    assert not userunits.packaged(f"{BOXYD}-other", tmp_path)


def test_rules_generates_what_make_docs_installs() -> None:
    makefile = (ROOT / "Makefile").read_text()
    made = set(re.findall(r"-m boxyctl\.completion (\w+)", makefile))
    assert made == {"man", "bash", "zsh", "fish"}
    assert set(re.findall(r"-m boxyctl\.completion (\w+)", RULES)) == made


def test_the_links_on_path_are_boxyctls_scripts() -> None:
    links = (DEBIAN / "boxy.links").read_text().split("\n")
    pairs = [line.split() for line in links if line.strip()]
    assert {dst for _, dst in pairs} == {"usr/bin/boxyctl", "usr/bin/boxy"}
    for src, dst in pairs:
        assert src == f"{PREFIX[1:]}/bin/{Path(dst).name}"
        assert Path(dst).name in launcher.SCRIPTS


def test_depends_names_every_library_loaded_through_ctypes() -> None:
    loaded = set()
    for path in [*(ROOT / "boxyd").rglob("*.py"), *(ROOT / "boxy").rglob("*.py")]:
        loaded |= set(re.findall(r'CDLL\("(lib[^"]+)"', path.read_text()))
    loaded.add("libseccomp.so.2")  # pyseccomp's
    assert loaded <= set(LIBRARIES), loaded - set(LIBRARIES)
    control = (DEBIAN / "control").read_text()
    depends = re.search(r"^Depends: (.*)$", control, re.M)
    assert depends is not None
    for lib in loaded:
        assert LIBRARIES[lib] in depends.group(1), lib


def test_maintainer_scripts_parse_and_undo_what_postinst_makes() -> None:
    for name in ("postinst", "prerm"):
        script = DEBIAN / f"boxy.{name}"
        r = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    postinst = (DEBIAN / "boxy.postinst").read_text()
    prerm = (DEBIAN / "boxy.prerm").read_text()
    # postinst: the interpreter, bytecode, the AppArmor profile; prerm removes each
    assert '"$PREFIX/bin/python3"' in postinst and 'rm -f "$PREFIX/bin/python3"' in prerm
    assert "compileall" in postinst and "-name __pycache__" in prerm
    assert "/etc/apparmor.d/boxy" in postinst and "rm -f /etc/apparmor.d/boxy" in prerm


@pytest.mark.parametrize(
    ("prefix", "executable", "expect"),
    [
        (PREFIX, f"{PREFIX}/bin/python3", "dpkg-reconfigure boxy"),
        ("/usr", "/usr/bin/python3", "this install cannot have one"),  # no venv
    ],
)
def test_the_doctors_apparmor_fix_is_this_installs(
    prefix: str, executable: str, expect: str
) -> None:
    assert expect in doctor.apparmor_fix(prefix, "/usr", executable)


def test_the_apparmor_fix_of_a_venv_with_its_own_interpreter_is_make_setup(
    tmp_path: Path,
) -> None:
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.write_bytes(b"")
    assert "make setup" in doctor.apparmor_fix(str(tmp_path), "/usr", str(python))
    pipx = tmp_path / "pipx"
    (pipx / "bin").mkdir(parents=True)
    (pipx / "bin" / "python").symlink_to("/usr/bin/python3")
    fix = doctor.apparmor_fix(str(pipx), "/usr", str(pipx / "bin" / "python"))
    assert "pipx" in fix and "make deb" in fix
