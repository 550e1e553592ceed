"""Path-level escapes: `..`, symlinks, /proc magic links, writes outside the work
directory, read-only trees with submounts, mount propagation, the scratch budget.

Where an attack would change the host, the verdict is taken on the host after the run,
not from what the payload says.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Boxy, User
from tests.escape.conftest import (
    assert_contained,
    boxy_argv,
    describe,
    output,
    plant,
    run_py,
    stop,
    umount,
    unplant,
    wait_for,
    write_payload,
)

pytestmark = pytest.mark.sandbox

MiB = 1 << 20


@pytest.fixture
def ssh_key(user: User) -> Iterator[tuple[Path, str]]:
    marker = f"boxy-secret-ssh-{uuid.uuid4().hex}"
    path = user.home / ".ssh" / "id_ed25519"
    created = plant(user, path, f"-----BEGIN OPENSSH PRIVATE KEY-----\n{marker}\n")
    try:
        assert user.run(["cat", str(path)]).returncode == 0  # readable on the host
        yield path, (marker if marker in path.read_text() else path.read_text().strip()[:40])
    finally:
        unplant(created)


@pytest.fixture
def host_public_file(user: User) -> Iterator[Path]:
    """A world-readable file that exists only on the host."""
    path = Path(f"/srv/boxy-host-only-{uuid.uuid4().hex}")
    path.write_text("boxy-secret-public\n")
    os.chmod(path, 0o644)
    try:
        assert user.run(["cat", str(path)]).returncode == 0
        yield path
    finally:
        path.unlink()


def test_dotdot_traversal(boxy: Boxy, user: User) -> None:
    sibling = boxy.workdir.parent / f"sibling-{uuid.uuid4().hex[:8]}"
    sibling.mkdir()
    (sibling / "secret").write_text("boxy-secret-sibling\n")
    user.chown(sibling)
    host_home = {p.name for p in user.home.iterdir()} - {"boxy-tests"}
    try:
        r = run_py(
            boxy,
            """
import json
for label, p in (("shadow3", "../../../etc/shadow"), ("shadow9", "../" * 9 + "etc/shadow"),
                 ("sibling", "../" + sys.argv[1] + "/secret")):
    data = read(label, p)
    if data:
        escaped(label, repr(data[:60]))
for label, p in (("ls-parent", ".."), ("ls-home", "../.."), ("ls-root", "../" * 9)):
    try:
        tried(label, json.dumps(sorted(os.listdir(p))))
    except OSError as e:
        tried(label, ename(e))
""",
            args=(sibling.name,),
        )
        got = assert_contained(
            r,
            "shadow3",
            "shadow9",
            "sibling",
            "ls-parent",
            "ls-home",
            results={"sibling": {"ENOENT"}},
        )
        # the parent holds exactly the work directory (the mount point boxy made), no sibling
        assert got["ls-parent"] == f'["{boxy.workdir.name}"]', describe(r)
        leaked = [n for n in host_home if f'"{n}"' in got["ls-home"]]
        assert not leaked, f"host home entries visible: {leaked}\n{describe(r)}"
        assert "boxy-secret-sibling" not in output(r)
    finally:
        shutil.rmtree(sibling)


def test_symlinks_out_of_workdir(
    boxy: Boxy, user: User, ssh_key: tuple[Path, str], host_public_file: Path
) -> None:
    key, marker = ssh_key
    # planted on the host before the run (as the payload's previous run could have)
    for name, target in (
        ("leak", key.parent),
        ("leak-srv", host_public_file),
        ("leak-shadow", Path("/etc/shadow")),
    ):
        os.symlink(target, boxy.workdir / name)
        os.lchown(boxy.workdir / name, user.uid, user.gid)
    r = run_py(
        boxy,
        """
key_dir, srv = sys.argv[1], sys.argv[2]
os.symlink(key_dir, "leak2")
os.symlink(srv, "leak2-srv")
os.symlink("/", "leak2-root")
for label, p in (("host-link-key", "leak/id_ed25519"), ("host-link-srv", "leak-srv"),
                 ("host-link-shadow", "leak-shadow"), ("own-link-key", "leak2/id_ed25519"),
                 ("own-link-srv", "leak2-srv"), ("own-link-root", "leak2-root" + srv)):
    data = read(label, p)
    if data:
        escaped(label, repr(data[:60]))
""",
        args=(str(key.parent), str(host_public_file)),
    )
    got = assert_contained(
        r,
        "host-link-key",
        "host-link-srv",
        "host-link-shadow",
        "own-link-key",
        "own-link-srv",
        "own-link-root",
    )
    assert all(v == "ENOENT" for v in got.values()), describe(r)
    assert marker not in output(r) and "boxy-secret-public" not in output(r)


def test_proc_magic_links(
    boxy: Boxy, ssh_key: tuple[Path, str], host_sleeper: subprocess.Popen[bytes]
) -> None:
    key, marker = ssh_key
    pid = host_sleeper.pid
    r = run_py(
        boxy,
        """
key, pid = sys.argv[1], sys.argv[2]
for label, p in (("self-root-shadow", "/proc/self/root/etc/shadow"),
                 ("self-root-key", "/proc/self/root" + key),
                 ("pid1-root-shadow", "/proc/1/root/etc/shadow"),
                 ("pid1-root-key", "/proc/1/root" + key),
                 ("host-environ", f"/proc/{pid}/environ"),
                 ("host-root-key", f"/proc/{pid}/root" + key)):
    data = read(label, p)
    if data:
        escaped(label, repr(data[:80]))
for label, p in (("pid1-cwd", "/proc/1/cwd"), ("pid1-root", "/proc/1/root"), ("host-cwd", f"/proc/{pid}/cwd")):
    try:
        names = os.listdir(p)
    except OSError as e:
        tried(label, ename(e))
    else:
        escaped(label, f"listed {names[:5]}")
""",
        args=(str(key), str(pid)),
    )
    got = assert_contained(
        r,
        "self-root-shadow",
        "self-root-key",
        "pid1-root-shadow",
        "pid1-root-key",
        "host-environ",
        "host-root-key",
        "pid1-cwd",
        "pid1-root",
        "host-cwd",
        results={"host-environ": {"ENOENT"}, "host-cwd": {"ENOENT"}, "self-root-key": {"ENOENT"}},
    )
    assert not any(v.startswith("read:") for v in got.values()), describe(r)
    assert marker not in output(r) and "BOXY_HOST_SECRET" not in output(r)
    assert host_sleeper.poll() is None  # the host process was real and still is


def test_writes_outside_workdir_do_not_reach_host(boxy: Boxy, user: User) -> None:
    tag = f"boxy-escape-{uuid.uuid4().hex[:8]}"
    other = user.home / f"other-dir-{tag}"
    other.mkdir()
    user.chown(other)
    # the user can write every one of these on the host: only the sandbox stops it
    host_writable = {
        "other-dir": other / "planted",
        "parent": boxy.workdir.parent / tag,
        "home": user.home / tag,
        "var-tmp": Path("/var/tmp") / tag,
        "tmp": Path("/tmp") / tag,
    }
    system = {"usr": Path("/usr") / tag, "etc": Path("/etc") / tag, "root": Path("/") / tag}
    targets = {**host_writable, **system}
    args = [f"{k}={v}" for k, v in targets.items()]
    try:
        r = run_py(
            boxy,
            """
for arg in sys.argv[1:]:
    label, path = arg.split("=", 1)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    except OSError:
        pass
    ok = write(label, path)
    if ok and label in ("usr", "etc", "root"):
        escaped(label, f"wrote {path}: the system tree is writable")
try:
    os.rename(os.getcwd(), os.path.dirname(os.getcwd()) + "/renamed-workdir")
except OSError as e:
    tried("rename-workdir", ename(e))
else:
    escaped("rename-workdir", "the work directory was renamed")
""",
            args=tuple(args),
        )
        assert_contained(r, *targets, "rename-workdir")
        changed = [str(p) for p in targets.values() if os.path.lexists(p)]
        assert not changed, f"host changed: {changed}\n{describe(r)}"
        assert list(other.iterdir()) == [], describe(r)
        assert boxy.workdir.is_dir()
    finally:
        shutil.rmtree(other, ignore_errors=True)
        for p in targets.values():
            if p.is_file():
                p.unlink()


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def test_home_writes_vanish(boxy: Boxy, user: User) -> None:
    tag = f"boxy-escape-{uuid.uuid4().hex[:8]}"
    watched = [
        user.home / ".bashrc",
        user.home / ".profile",
        user.home / ".ssh" / "authorized_keys",
        user.home / tag,
        user.home / ".config" / tag,
    ]
    before = {p: _digest(p) for p in watched}
    code = """
tag = sys.argv[1]
home = os.environ["HOME"]
seen = os.path.exists(os.path.join(home, tag))
tried("seen-before", str(seen))
os.makedirs(os.path.join(home, ".ssh"), exist_ok=True)
os.makedirs(os.path.join(home, ".config"), exist_ok=True)
for label, rel, mode in (("bashrc", ".bashrc", "ab"), ("profile", ".profile", "wb"),
                         ("authorized-keys", ".ssh/authorized_keys", "ab"),
                         ("new", tag, "wb"), ("config", ".config/" + tag, "wb")):
    write(label, os.path.join(home, rel), b"boxy-escape-" + tag.encode() + b"\\n", mode)
with open(os.path.join(home, tag), "rb") as f:
    tried("readback", f.read().decode().strip())
"""
    r = run_py(boxy, code, args=(tag,))
    got = assert_contained(
        r,
        "bashrc",
        "profile",
        "authorized-keys",
        "new",
        "config",
        "readback",
        results={k: {"written"} for k in ("bashrc", "profile", "authorized-keys", "new", "config")},
    )
    assert got["readback"] == f"boxy-escape-{tag}", describe(r)  # the writes were real
    assert {p: _digest(p) for p in watched} == before, describe(r)
    r2 = run_py(boxy, code, args=(tag,))  # a second run starts from an empty $HOME again
    got2 = assert_contained(r2, "seen-before")
    assert got2["seen-before"] == "False", describe(r2)
    assert {p: _digest(p) for p in watched} == before


@pytest.fixture
def ro_tree_with_submount(user: User) -> Iterator[Path]:
    """/srv/boxy-ro-X/sub is a tmpfs mount (world-writable on the host) inside a tree
    that will be exposed read-only."""
    base = Path(f"/srv/boxy-ro-{uuid.uuid4().hex[:8]}")
    sub = base / "sub"
    sub.mkdir(parents=True)
    (base / "plain.txt").write_text("plain\n")
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "boxy-escape", str(sub)], check=True
    )
    try:
        (sub / "host-file").write_text("in-submount\n")
        os.chmod(sub / "host-file", 0o666)
        probe = user.run(["touch", str(sub / "probe")])  # positive: writable on the host
        assert probe.returncode == 0, probe.stderr
        (sub / "probe").unlink()
        yield base
    finally:
        umount(sub)
        shutil.rmtree(base, ignore_errors=True)


def test_submount_of_ro_tree_is_read_only(boxy: Boxy, ro_tree_with_submount: Path) -> None:
    base = ro_tree_with_submount
    r = run_py(
        boxy,
        """
base = sys.argv[1]
tried("submount-read", open(base + "/sub/host-file").read().strip())
for label, p, mode in (("sub-new", base + "/sub/new", "wb"), ("sub-existing", base + "/sub/host-file", "ab"),
                       ("top-new", base + "/new", "wb"), ("top-existing", base + "/plain.txt", "ab")):
    if write(label, p, mode=mode):
        escaped(label, f"wrote {p}")
try:
    os.mkdir(base + "/sub/dir")
except OSError as e:
    tried("sub-mkdir", ename(e))
else:
    escaped("sub-mkdir", "created a directory in the submount")
""",
        "--ro",
        str(base),
        args=(str(base),),
    )
    assert_contained(
        r,
        "submount-read",
        "sub-new",
        "sub-existing",
        "top-new",
        "top-existing",
        "sub-mkdir",
        results={
            "submount-read": {"in-submount"},
            "sub-new": {"EROFS"},
            "sub-existing": {"EROFS"},
            "sub-mkdir": {"EROFS"},
        },
    )
    assert not (base / "sub" / "new").exists()
    assert (base / "sub" / "host-file").read_text() == "in-submount\n"


PROPAGATION_PAYLOAD = """
shared, workdir = sys.argv[1], os.getcwd()
tried("before", str(os.path.exists(shared + "/before")))
with open(workdir + "/started", "w") as f:
    f.write("1")
deadline = time.monotonic() + 30
while not os.path.exists(workdir + "/go") and time.monotonic() < deadline:
    time.sleep(0.05)
tried("go", str(os.path.exists(workdir + "/go")))
tried("new-dir", str(os.path.isdir(shared + "/new")))  # the directory itself is on the old tmpfs
if os.path.exists(shared + "/new/canary"):
    escaped("propagation", "a host mount made after the start appeared inside")
with open("/proc/self/mountinfo") as f:
    if any(" " + shared + "/new " in line for line in f):
        escaped("propagation", "the new host mount is in mountinfo")
"""


@pytest.mark.parametrize("where", ["workdir", "ro-tree"])
def test_later_host_mounts_do_not_propagate(boxy: Boxy, user: User, where: str) -> None:
    if where == "workdir":
        shared, flags = boxy.workdir / "shared", []
    else:
        shared = Path(f"/srv/boxy-shared-{uuid.uuid4().hex[:8]}")
        flags = ["--ro", str(shared)]
    shared.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "boxy-shared", str(shared)], check=True
    )
    new = shared / "new"
    proc = None
    try:
        subprocess.run(["mount", "--make-shared", str(shared)], check=True)
        (shared / "before").write_text("before\n")
        new.mkdir()
        write_payload(boxy, PROPAGATION_PAYLOAD)
        proc = subprocess.Popen(
            user.cmd(boxy_argv(*flags, cmd=["python3", "payload.py", str(shared)])),
            cwd=boxy.workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        wait_for(
            lambda: (boxy.workdir / "started").exists() or proc.poll() is not None,
            60,
            "the sandbox",
        )
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "boxy-late", str(new)], check=True)
        (new / "canary").write_text("late\n")
        (boxy.workdir / "go").write_text("1")
        out, err = proc.communicate(timeout=60)
        r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        assert_contained(
            r,
            "before",
            "go",
            "new-dir",
            results={"before": {"True"}, "go": {"True"}, "new-dir": {"True"}},
        )
    finally:
        if proc is not None:
            stop(proc)
        umount(new)
        umount(shared)
        if where != "workdir":
            shutil.rmtree(shared, ignore_errors=True)


def test_scratch_budget_is_shared_and_bounded(boxy: Boxy) -> None:
    r = run_py(
        boxy,
        """
import subprocess
home = os.environ["HOME"]
write("home-before", home + "/before", b"x" * 4096)
dd = subprocess.run(["dd", "if=/dev/zero", "of=/tmp/fill", "bs=1M", "count=100"], capture_output=True, text=True)
size = os.path.getsize("/tmp/fill")
enospc = "No space left on device" in dd.stderr
tried("dd", f"rc={dd.returncode},enospc={enospc},mib={size >> 20}")
if size > 64 * 1024 * 1024:
    escaped("dd", f"/tmp took {size} bytes, more than --memory")
for label, p in (("home-full", home + "/after"), ("shm-full", "/dev/shm/after"), ("tmp-full", "/tmp/after")):
    if write(label, p, b"y" * (1 << 20)):
        escaped(label, "room left beyond the shared budget")
os.unlink("/tmp/fill")
write("home-freed", home + "/again", b"z" * (1 << 20))
""",
        "--memory",
        "64MiB",
    )
    got = assert_contained(
        r,
        "home-before",
        "dd",
        "home-full",
        "shm-full",
        "tmp-full",
        "home-freed",
        results={
            "home-before": {"written"},
            "home-full": {"ENOSPC"},
            "shm-full": {"ENOSPC"},
            "tmp-full": {"ENOSPC"},
            "home-freed": {"written"},
        },
    )
    fields = dict(kv.split("=") for kv in got["dd"].split(","))
    assert fields["rc"] != "0" and fields["enospc"] == "True", describe(r)
    assert 56 <= int(fields["mib"]) <= 64, describe(r)  # the budget is --memory, not less
