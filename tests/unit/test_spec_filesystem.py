"""boxyd.config.filesystem: build_spec's filesystem step (paths, protect, reveal,
copies, tmpfs, the package cache), over a small tree in tmp_path."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

from boxy import caches
from boxy.errors import ProfileError, UsageError
from boxy.request import CopyItem, RunOptions
from boxyd.config import filesystem
from boxyd.config.profileschema import Profile
from boxyd.config.runspec import CopyEntry, PathEntry


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    home = tmp_path / "home"
    (home / "proj").mkdir(parents=True)
    (home / "data").mkdir()
    (home / "file.txt").write_text("f")
    (home / "proj" / ".env").write_text("x")
    return {"home": str(home), "wd": str(home / "proj"), "tmp": str(tmp_path)}


def prof(**kw: Any) -> Profile:
    return Profile(name="p", source="p.yaml", **kw)


def decide(tree: dict[str, str], o: RunOptions | None = None, p: Profile | None = None) -> Any:
    notes: list[str] = []
    got = filesystem.decide(
        o or RunOptions(), p or prof(), cwd=tree["wd"], workdir=tree["wd"], home=tree["home"],
        uid=os.getuid(), client_env={}, notes=notes,
    )  # fmt: skip
    return got, notes


def test_nothing_asked_exposes_nothing(tree: dict[str, str]) -> None:
    got, notes = decide(tree)
    assert got == filesystem.Filesystem([], [], [], [], [], [], [], [], [], [], [], False, [])
    assert notes == []


def test_paths_the_profiles_first_each_once(tree: dict[str, str]) -> None:
    data, share, lib = (tree["tmp"] + n for n in ("/home/data", "/share", "/lib"))
    os.mkdir(share)
    os.mkdir(lib)
    p = prof(ro=[PathEntry(share)], rw=[PathEntry(data)], secrets=["*.key"])
    got, _ = decide(tree, RunOptions(ro=[share, lib], rw=["../data"]), p)
    assert got.ro == [PathEntry(share), PathEntry(lib)]
    assert got.rw == [PathEntry(data)]
    assert got.secrets == ["*.key"]


def test_check_paths_labels_and_refusals(tree: dict[str, str]) -> None:
    notes: list[str] = []
    gone = PathEntry("/no/such", optional=True)
    e: pytest.ExceptionInfo[UsageError]  # a ProfileError, then a plain UsageError
    got = filesystem.check_paths("ro", prof(ro=[gone]), ["/usr"], "/", notes)
    assert got == [("--ro", PathEntry("/usr"))]
    assert notes == ["profile p.yaml: filesystem.ro /no/such: absent; skipped"]
    with pytest.raises(ProfileError) as e:
        filesystem.check_paths("rw", prof(rw=[PathEntry("/no/such")]), [], "/", [])
    assert str(e.value) == "profile p.yaml: filesystem.rw /no/such: no such file or directory"
    with pytest.raises(UsageError) as e:
        filesystem.check_paths("protect", prof(), ["/no/such"], "/", [])
    assert type(e.value) is UsageError
    assert str(e.value) == "--protect /no/such: no such file or directory"


def test_mkdir_may_be_absent_but_not_a_file(tree: dict[str, str]) -> None:
    new, file = tree["home"] + "/new/dir", tree["home"] + "/file.txt"
    assert filesystem.check_paths("mkdir", prof(), [new], "/", []) == [("--mkdir", PathEntry(new))]
    with pytest.raises(UsageError) as e:
        filesystem.check_paths("mkdir", prof(), [file], "/", [])
    assert str(e.value) == f"--mkdir {file}: exists and is not a directory"
    with pytest.raises(ProfileError):
        filesystem.check_paths("mkdir", prof(mkdir=[PathEntry(file)]), [], "/", [])


def test_one_path_both_read_only_and_writable_is_refused(tree: dict[str, str]) -> None:
    data = tree["home"] + "/data"
    with pytest.raises(UsageError) as e:
        decide(tree, RunOptions(ro=[data], rw=[data]))
    assert str(e.value) == f"{data}: exposed both read-only and read-write"


def test_protect(tree: dict[str, str]) -> None:
    wd, data = tree["wd"], tree["home"] + "/data"
    entries = [PathEntry(wd + "/.env")]
    assert filesystem.check_protect(entries, [wd], "p", []) == [PathEntry(wd + "/.env")]
    with pytest.raises(UsageError) as e:
        filesystem.check_protect([PathEntry(data)], [wd], "p", [])
    assert str(e.value) == f"--protect {data}: not inside the work directory or a --rw path"
    notes: list[str] = []
    optional = [PathEntry(data, optional=True)]
    assert filesystem.check_protect(optional, [wd], "p", notes) == []
    assert notes == [f"protect {data}: leads outside the writable trees; skipped"]


def test_protect_refuses_a_symlink(tree: dict[str, str]) -> None:
    link = tree["wd"] + "/envlink"
    os.symlink(".env", link)
    with pytest.raises(UsageError) as e:
        filesystem.check_protect([PathEntry(link)], [tree["wd"]], "p", [])
    assert str(e.value) == f"--protect {link}: is a symlink; name what it points to"
    with pytest.raises(UsageError) as e:
        entry = PathEntry(link, optional=True)
        filesystem.check_protect([entry], [tree["wd"]], "p.yaml", [])
    assert str(e.value) == (
        f"profile p.yaml: {link} is a symlink, which cannot be made read-only (an earlier "
        "run may have planted it); look at it and remove it"
    )


def test_protect_and_reveal_through_decide(tree: dict[str, str]) -> None:
    o = RunOptions(protect=[".env"], reveal=[".env", "x"])
    got, _ = decide(tree, o, prof(reveal=[PathEntry(tree["wd"] + "/x")]))
    assert got.protect == [PathEntry(tree["wd"] + "/.env")]
    # lexical: matched as the walk finds the entries
    assert got.reveal == [tree["wd"] + "/x", tree["wd"] + "/.env"]


def test_exposing_the_home_or_a_socket_is_refused(tree: dict[str, str]) -> None:
    with pytest.raises(UsageError, match="your home directory"):
        decide(tree, RunOptions(ro=[tree["home"]]))
    data = tree["home"] + "/data"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(data + "/agent.sock")
        with pytest.raises(UsageError) as e:
            decide(tree, RunOptions(ro=[data]))
    assert str(e.value) == (
        f"--ro {data}: holds the unix socket {data}/agent.sock, which the sandbox could "
        "connect to; expose a narrower path"
    )


def test_flag_copies() -> None:
    o = RunOptions(copy=[CopyItem("a")], copy_ro=[CopyItem("/b", "/opt/../opt/b")])
    assert filesystem.flag_copies(o, "/w") == [
        ("--copy", CopyEntry("/w/a", "/w/a")),
        ("--copy-ro", CopyEntry("/b", "/opt/b")),
    ]
    with pytest.raises(UsageError) as e:
        filesystem.flag_copies(RunOptions(copy=[CopyItem("a", "rel")]), "/w")
    assert str(e.value) == "--copy a:rel: the destination must be absolute"


def test_check_copies_a_flag_replaces_the_profiles_copy(tree: dict[str, str]) -> None:
    f = tree["home"] + "/file.txt"
    notes: list[str] = []
    copies = [
        ("--copy", CopyEntry(f, "/opt/f")),
        ("profile p: filesystem.copy", CopyEntry(f, "/opt/f")),
    ]
    assert filesystem.check_copies(copies, notes) == copies[:1]
    assert notes == [f"profile p: filesystem.copy {f}: replaced by --copy to /opt/f"]


def test_check_copies_refusals(tree: dict[str, str]) -> None:
    f, d = tree["home"] + "/file.txt", tree["home"] + "/data"
    twice = [("--copy", CopyEntry(f, "/opt/f")), ("--copy-ro", CopyEntry(f, "/opt/f"))]
    cases: list[tuple[list[filesystem.LabelledCopy], type[Exception], str]] = [
        (twice, UsageError, f"--copy-ro {f}: a second copy to /opt/f"),
        (
            [
                ("profile p: filesystem.copy", CopyEntry(f, "/a")),
                ("profile p: filesystem.copy_ro", CopyEntry(f, "/a")),
            ],
            ProfileError,
            f"profile p: filesystem.copy_ro {f}: a second copy to /a",
        ),
        (
            [("--copy", CopyEntry("/no/such", "/x"))],
            UsageError,
            "--copy /no/such: no such file or directory",
        ),
        ([("--copy", CopyEntry(d, "/x"))], UsageError, f"--copy {d}: not a regular file"),
        (
            [("--copy", CopyEntry(f, "/"))],
            UsageError,
            f"--copy {f}:/: the destination must name a file",
        ),
        (
            [("profile p: filesystem.copy", CopyEntry(f, "/etc/x"))],
            ProfileError,
            f"profile p: filesystem.copy {f}:/etc/x: the destination lies on the "
            "sandbox's read-only /etc; copy it under $HOME or /tmp",
        ),
    ]
    for copies, kind, message in cases:
        with pytest.raises(kind) as e:
            filesystem.check_copies(copies, [])
        assert type(e.value) is kind and str(e.value) == message


def test_check_copies_refuses_what_you_cannot_read(
    tree: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tree["home"] + "/file.txt"
    os.chmod(f, 0)
    _closed_to_the_user(monkeypatch, f)  # as root (CI) the mode alone would not close it
    with pytest.raises(UsageError) as e:
        filesystem.check_copies([("--copy", CopyEntry(f, "/x"))], [])
    assert str(e.value) == f"--copy {f}: not readable by you"


def test_check_copies_skips_an_absent_optional_copy() -> None:
    notes: list[str] = []
    entry = CopyEntry("/no/such", "/x", optional=True)
    assert filesystem.check_copies([("profile p: filesystem.copy", entry)], notes) == []
    assert notes == ["profile p: filesystem.copy /no/such: absent; skipped"]


def test_place_copies() -> None:
    copies = [
        ("--copy", CopyEntry("/a", "/opt/a")),
        ("--copy-ro", CopyEntry("/b", "/opt/b")),
        ("profile p: filesystem.copy_ro", CopyEntry("/c", "/opt/c")),
    ]
    got = filesystem.place_copies(copies, ["/w"])
    assert got == (
        [CopyEntry("/a", "/opt/a")],
        [CopyEntry("/b", "/opt/b"), CopyEntry("/c", "/opt/c")],
    )
    with pytest.raises(UsageError) as e:
        filesystem.place_copies([("--copy", CopyEntry("/a", "/w/a"))], ["/w"])
    assert str(e.value) == (
        "--copy /a:/w/a: the destination lies inside the exposed path /w; a copy goes "
        "onto the sandbox's own tmpfs"
    )


def test_tmpfs() -> None:
    p = prof(tmpfs=["/opt/t", "/home/u/.cache/t", "/opt/t"])
    assert filesystem.check_tmpfs(p, ["/w"], "/home/u") == ["/opt/t", "/home/u/.cache/t"]


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/home/u", "already a fresh tmpfs"),
        ("/tmp", "already a fresh tmpfs"),
        ("/dev/shm", "already a fresh tmpfs"),
        ("/usr/x", "overlaps /usr, which is bound in"),
        ("/w/sub", "overlaps /w, which is bound in"),
        ("/opt", "overlaps /opt/w, which is bound in"),  # a tmpfs over an exposed tree
    ],
)
def test_tmpfs_refusals(path: str, why: str) -> None:
    with pytest.raises(ProfileError) as e:
        filesystem.check_tmpfs(prof(tmpfs=[path]), ["/w", "/opt/w"], "/home/u")
    assert str(e.value).startswith(f"profile p.yaml: filesystem.tmpfs {path}: {why}")


def test_prepare_caches_makes_only_boxys_own(tree: dict[str, str]) -> None:
    cache = caches.project_dir(tree["home"], "p", tree["wd"])
    other = tree["home"] + "/other"
    filesystem.prepare_caches(
        prof(mkdir=[PathEntry(cache), PathEntry(other)]), tree["wd"], tree["home"]
    )
    assert os.path.isdir(cache) and not os.path.exists(other)
    assert os.stat(cache).st_mode & 0o777 == 0o700


def test_prepare_caches_says_what_failed(tree: dict[str, str]) -> None:
    cache = caches.project_dir(tree["home"], "p", tree["wd"])
    Path(tree["home"], ".cache").mkdir()
    Path(tree["home"], ".cache", "boxy").write_text("")  # a file where the directory goes
    with pytest.raises(UsageError) as e:
        filesystem.prepare_caches(prof(mkdir=[PathEntry(cache)]), tree["wd"], tree["home"])
    assert str(e.value).startswith(f"profile p.yaml: the package cache {cache}: ")
    assert str(e.value).endswith("; `boxyctl cache clean` removes it")


def _closed_to_the_user(monkeypatch: pytest.MonkeyPatch, closed: str) -> None:
    """os.access as an unprivileged user sees CLOSED (the unit tests may run as root)."""
    real = os.access

    def access(path: Any, mode: int, **kw: Any) -> bool:
        return not str(path).startswith(closed) and real(path, mode, **kw)

    monkeypatch.setattr(os, "access", access)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (RunOptions(rw=["{closed}"]), "--rw {closed}: not readable by you"),
        (RunOptions(ro=["{closed}"]), "--ro {closed}: not readable by you"),
        (RunOptions(mkdir=["{closed}/x"]), "--mkdir {closed}/x: cannot be made: {closed} is not"),
        (RunOptions(mkdir=["{closed}"]), "--mkdir {closed}: exists and is not writable by you"),
    ],
)
def test_a_path_the_user_cannot_read_or_make_is_refused_before_the_start(
    tree: dict[str, str], monkeypatch: pytest.MonkeyPatch, options: RunOptions, message: str
) -> None:
    closed = tree["tmp"] + "/closed"
    os.mkdir(closed)
    _closed_to_the_user(monkeypatch, closed)
    for field in ("rw", "ro", "mkdir"):
        setattr(options, field, [p.format(closed=closed) for p in getattr(options, field)])
    with pytest.raises(UsageError, match="^" + message.format(closed=closed)):
        decide(tree, options)


def test_rw_of_a_tree_the_user_can_only_read_says_ro(
    tree: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m, **kw: not m & os.W_OK and real(p, m, **kw))
    with pytest.raises(UsageError, match="not writable by you; --ro exposes it read-only"):
        decide(tree, RunOptions(rw=[tree["home"] + "/data"]))


def test_mkdir_under_a_missing_parent_is_made_where_the_user_can_write(
    tree: dict[str, str],
) -> None:
    got, _ = decide(tree, RunOptions(mkdir=[tree["home"] + "/new/deeper"]))
    assert got.mkdir == [PathEntry(tree["home"] + "/new/deeper")]


def test_a_reveal_of_a_missing_path_is_said_in_one_line(tree: dict[str, str]) -> None:
    warnings: list[str] = []
    got = filesystem.decide(
        RunOptions(reveal=[".env", "nosuch"]), prof(), cwd=tree["wd"], workdir=tree["wd"],
        home=tree["home"], uid=os.getuid(), client_env={}, notes=[], warnings=warnings,
    )  # fmt: skip
    assert got.reveal == [tree["wd"] + "/.env", tree["wd"] + "/nosuch"]
    assert warnings == [
        f"--reveal {tree['wd']}/nosuch: no such file or directory (yet); "
        "it is revealed if the run creates it"
    ]


def test_a_presets_absent_protect_entries_say_nothing(tree: dict[str, str]) -> None:
    p = prof(
        protect=[PathEntry(tree["wd"] + n, optional=True) for n in ("/.vscode", "/.husky")],
        ro=[PathEntry(tree["home"] + "/.claude", optional=True)],
    )
    got, notes = decide(tree, p=p)
    assert got.protect == []
    assert notes == [f"profile p.yaml: filesystem.ro {tree['home']}/.claude: absent; skipped"]


def test_edit_config_names_a_held_entry_itself(tree: dict[str, str]) -> None:
    work = tree["wd"]
    os.mkdir(f"{work}/pkg")
    got, _ = decide(tree, RunOptions(edit_config=[".claude", "pkg/.npmrc"]), prof())
    assert got.edit_config == [f"{work}/.claude", f"{work}/pkg/.npmrc"]
    for bad, why in (
        (".claude/settings.local.json", "which is held whole; name that"),
        ("src", "not a file boxy holds"),
        ("/etc/.npmrc", "not inside the work directory"),
    ):
        with pytest.raises(UsageError, match=why):
            decide(tree, RunOptions(edit_config=[bad]), prof())
