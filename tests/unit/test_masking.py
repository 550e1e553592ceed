"""masking.py over real trees: the credentials a walk finds, the files git's config
includes, the profile's own patterns, and every name of a hard-linked credential."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from boxy.errors import SetupError
from boxyd.plan import masking, worktree
from boxyd.plan.masking import Found

S = "SECRETvalue"


def found(root: Path, **kw: object) -> dict[str, Found]:
    return {f.rel: f for f in worktree.walk(str(root), git_guard=False, **kw).credentials}  # type: ignore[arg-type]


def test_included_git_configs_are_scrubbed(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "ci").mkdir()
    (tmp_path / "ci/auth.inc").write_text(
        f'[http "https://g.example/"]\n\textraheader = AUTHORIZATION: basic {S}\n'
        "[core]\n\tinclude = x\n"
    )
    (tmp_path / "ci/cond.inc").write_text(f'[remote "o"]\n\turl = https://x:{S}@g.example/r\n')
    (tmp_path / "ci/plain.inc").write_text("[user]\n\tname = bob\n")
    with open(tmp_path / ".git/config", "a") as f:
        f.write(
            '[include]\n\tpath = ../ci/auth.inc\n[includeIf "gitdir:/nowhere/"]\n\tpath = ../ci/cond.inc\n'
            "[include]\n\tpath = ../ci/plain.inc\n"
        )
    got = found(tmp_path)
    assert {"ci/auth.inc", "ci/cond.inc"} <= set(got) and "ci/plain.inc" not in got
    for rel in ("ci/auth.inc", "ci/cond.inc"):
        assert got[rel].kind == "git config" and S.encode() not in got[rel].content
    assert b"[core]" in got["ci/auth.inc"].content
    assert "https://g.example/r" in got["ci/cond.inc"].content.decode()


def test_profile_patterns(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf/db.secret").write_text(S)
    (tmp_path / "vault").mkdir()
    (tmp_path / "node_modules/p").mkdir(parents=True)
    (tmp_path / "node_modules/p/x.secret").write_text(S)
    got = found(tmp_path, secrets=["*.secret", "vault"])
    assert set(got) == {"conf/db.secret", "vault"}
    assert got["vault"].is_dir and not got["conf/db.secret"].is_dir
    assert found(tmp_path) == {}


def test_a_hard_link_is_covered_under_every_name(tmp_path: Path) -> None:
    (tmp_path / ".env.local").write_text(f"KEY={S}\n")
    (tmp_path / "node_modules/.cache").mkdir(parents=True)
    os.link(tmp_path / ".env.local", tmp_path / "node_modules/.cache/e")
    (tmp_path / ".git/objects").mkdir(parents=True)
    os.link(tmp_path / ".env.local", tmp_path / ".git/objects/x")
    (tmp_path / "other").write_text("not linked")
    got = found(tmp_path)
    assert set(got) == {".env.local", "node_modules/.cache/e", ".git/objects/x"}
    assert got["node_modules/.cache/e"].note == "a hard link of .env.local"
    assert (
        got["node_modules/.cache/e"].kind == "environment file"
        and not got["node_modules/.cache/e"].is_dir
    )
    assert "3 hard links" in got[".env.local"].note and "outside" not in got[".env.local"].note


def test_a_scrubbed_credential_links_get_the_scrubbed_copy(tmp_path: Path) -> None:
    (tmp_path / ".npmrc").write_text(f"registry=https://r.example/\n//r.example/:_authToken={S}\n")
    (tmp_path / "a/b").mkdir(parents=True)
    os.link(tmp_path / ".npmrc", tmp_path / "a/b/copy.txt")
    got = found(tmp_path)
    assert got["a/b/copy.txt"].content == got[".npmrc"].content
    assert S.encode() not in got["a/b/copy.txt"].content and b"registry=" in got[".npmrc"].content


def test_a_link_outside_the_tree_is_said(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / ".env").write_text(S)
    os.link(tree / ".env", tmp_path / "outside")
    got = found(tree)
    assert set(got) == {".env"}
    assert (
        got[".env"].note == "2 hard links: also none in the tree; 1 outside the tree "
        "(not shown to the payload, but not covered there)"
    )


def test_no_linked_credential_no_search(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(S)
    (tmp_path / "x").write_text("x")
    os.link(tmp_path / "x", tmp_path / "y")  # linked, but not a credential
    got = found(tmp_path)
    assert set(got) == {".env"} and got[".env"].note == ""


# --- what a payload can make one tree's credentials cost (issue #30 §3) ---------------


def test_more_credentials_than_the_mounts_allow_refuse_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(masking, "FOUND_MAX", 5)
    for i in range(5):
        (tmp_path / f".env.{i}").write_text("K=1\n")
    assert len(found(tmp_path)) == 5
    (tmp_path / ".env.5").write_text("K=1\n")
    with pytest.raises(SetupError, match="more than 5 credential files"):
        found(tmp_path)


def test_scrubbed_copies_past_their_room_are_covered_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = "registry=https://r.example/\n//r.example/:_authToken=" + S + "\n" + "#" * 200 + "\n"
    monkeypatch.setattr(masking, "STAND_INS_MAX", 2 * len(body))
    for i in range(4):
        (tmp_path / f"p{i}").mkdir()
        (tmp_path / f"p{i}/.npmrc").write_text(body)
    got = found(tmp_path)
    scrubbed = [f for f in got.values() if f.content]
    assert len(got) == 4 and len(scrubbed) == 2  # the first two fit, the others are empty
    assert all(S.encode() not in f.content for f in got.values())
    assert sum(len(f.content) for f in got.values()) <= 2 * len(body)


def test_a_walk_in_boxyd_s_thread_hands_on_many_entries_or_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few directories can hold a million names or 40 credentials of 4 MiB: the small
    walk (a LIMIT given) stops, and the walk process does it instead."""
    monkeypatch.setattr(worktree, "SMALL_ENTRIES", 50)
    monkeypatch.setattr(worktree, "SMALL_BYTES", 1000)
    (tmp_path / "d").mkdir()
    for i in range(40):
        (tmp_path / f"d/f{i}").write_text("x")
    worktree.walk(str(tmp_path), git_guard=False, limit=10)  # 41 entries: in the thread
    for i in range(40, 60):
        (tmp_path / f"d/f{i}").write_text("x")
    with pytest.raises(worktree.LargerThan, match="more than 50 entries"):
        worktree.walk(str(tmp_path), git_guard=False, limit=10)
    assert len(worktree.walk(str(tmp_path), git_guard=False).dirs) == 2  # no limit: walked
    for i in range(60):
        (tmp_path / f"d/f{i}").unlink()
    for i in range(3):
        (tmp_path / f"d/{i}").mkdir()
        (tmp_path / f"d/{i}/.npmrc").write_text("registry=x\n" + "#" * 600 + "\n")
    with pytest.raises(worktree.LargerThan, match="more than 1,000 bytes of credentials"):
        worktree.walk(str(tmp_path), git_guard=False, limit=10)


def test_a_unix_socket_anywhere_is_covered(tmp_path: Path) -> None:
    """Without Landlock's unix-socket scope a host server listening in the tree would be
    reachable: its stand-in is an empty file (a connect() to a file is refused)."""
    import socket

    (tmp_path / "node_modules/.cache").mkdir(parents=True)
    socks = [socket.socket(socket.AF_UNIX) for _ in range(2)]
    socks[0].bind(str(tmp_path / "wd.sock"))
    socks[1].bind(str(tmp_path / "node_modules/.cache/s"))
    os.mkfifo(tmp_path / "fifo")
    try:
        got = found(tmp_path)
    finally:
        for s in socks:
            s.close()
    assert set(got) == {"wd.sock", "node_modules/.cache/s"}
    assert got["wd.sock"].kind == "unix socket" and got["wd.sock"].content == b""


def test_every_name_of_a_socket_is_covered(tmp_path: Path) -> None:
    """A socket's other names lead to it as well (connect() goes by the inode)."""
    import socket

    (tmp_path / "deep/er").mkdir(parents=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "wd.sock"))
    try:
        os.link(tmp_path / "wd.sock", tmp_path / "deep/er/other")
        got = found(tmp_path)
        names, nlink = masking.socket_names(str(tmp_path), "wd.sock")
    finally:
        s.close()
    assert set(got) == {"wd.sock", "deep/er/other"}, got
    assert (names, nlink) == (["deep/er/other"], 2)


# keys in their real formats (the headers and shapes their tools write), under names
# that say nothing: found by what they hold
CORPUS = {
    "OpenSSH": b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n",
    "RSA": b"-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----\n",
    "PKCS#8": b"-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkq\n-----END PRIVATE KEY-----\n",
    "PGP": b"-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF\n-----END PGP PRIVATE KEY BLOCK-----\n",
    "PuTTY": b"PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: k\nPublic-Lines: 2\n",
    "service account": (
        b'{\n  "type": "service_account",\n  "project_id": "p",\n  "private_key_id": "x",\n'
        b'  "private_key": "-----BEGIN PRIVATE KEY-----\\nMII\\n-----END PRIVATE KEY-----\\n"\n}\n'
    ),
}


def test_keys_under_ordinary_names_are_found_by_what_they_hold(tmp_path: Path) -> None:
    import secrets

    names = {}
    for i, (what, data) in enumerate(CORPUS.items()):
        name = secrets.token_hex(4) + ("", ".txt", ".json", "", ".asc", ".json")[i]
        (tmp_path / "deep" / str(i)).mkdir(parents=True)
        (tmp_path / "deep" / str(i) / name).write_bytes(data)
        names[f"deep/{i}/{name}"] = what
    # what only looks like one, or lies where nothing is searched: not covered
    (tmp_path / "README").write_text("a key goes in -----BEGIN PUBLIC KEY----- blocks\n")
    (tmp_path / "package.json").write_text('{"name": "service_account"}')
    (tmp_path / "node_modules/p").mkdir(parents=True)
    (tmp_path / "node_modules/p/key").write_bytes(CORPUS["RSA"])
    (tmp_path / "src.py").write_bytes(CORPUS["RSA"])  # code, by its name: not probed
    got = found(tmp_path)
    assert set(got) == set(names), got
    assert all(f.content == b"" and f.note == "found by what it holds" for f in got.values())


def test_keys_the_real_tools_generate_are_found_under_random_names(tmp_path: Path) -> None:
    """Generated by the tools themselves (ssh-keygen: OpenSSH, PEM RSA, PKCS#8;
    openssl: EC; both installed by `make setup`), saved under random names: each found
    by what it holds."""
    import secrets

    keys = tmp_path / "gen"
    keys.mkdir()
    made = []
    for fmt in ("RFC4716", "PEM", "PKCS8"):
        out = keys / f"k-{fmt}"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "rsa", "-b", "1024", "-N", "", "-m", fmt, "-f", str(out)],
            check=True,
        )
        made.append(out)
    out = keys / "k-ec"
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-out", str(out)],
        check=True, capture_output=True,
    )  # fmt: skip
    made.append(out)
    work = tmp_path / "w"
    work.mkdir()
    for src in made:
        (work / (secrets.token_hex(5) + ".txt")).write_bytes(src.read_bytes())
    assert len(found(work)) == len(made)


def _gpg_secret_key(home: Path) -> bytes:
    """A real OpenPGP secret key, exported binary as `gpg --export-secret-keys` does
    (gnupg: installed by `make setup`)."""
    home.mkdir(mode=0o700)
    gpg = ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback"]
    subprocess.run(
        [*gpg, "--passphrase", "", "--quick-gen-key", "t@example", "ed25519", "sign", "never"],
        check=True, capture_output=True,
    )  # fmt: skip
    out = subprocess.run([*gpg, "--export-secret-keys"], check=True, capture_output=True).stdout
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True)
    return out


def test_more_formats_under_any_name(tmp_path: Path) -> None:
    """A second attack round (issue 31): a binary OpenPGP secret key, a PEM key base64
    again in a Kubernetes Secret, a bundle whose key comes after 4 KiB of certificates,
    an App Store Connect .p8, an OpenVPN profile with its key inline, a WireGuard
    config, an age identity: each found by what it holds."""
    ec = subprocess.run(
        ["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    import base64

    wg = base64.b64encode(os.urandom(32))
    work = tmp_path / "w"
    files = {
        "signing-key.gpg": _gpg_secret_key(tmp_path / "gnupg"),
        "deploy/tls-secret.yaml": b"apiVersion: v1\nkind: Secret\ndata:\n  tls.key: "
        + base64.b64encode(ec)
        + b"\n",
        "server_bundle": b"# chain\n" * 600 + ec,
        "AuthKey_7Q2X.p8": ec,
        "vpn/client.ovpn": b"client\nremote vpn.example 1194\n<key>\n" + ec + b"</key>\n",
        "wg0.conf": b"[Interface]\nAddress = 10.0.0.2/32\nPrivateKey = " + wg + b"\n",
        "keys.txt": b"# created: 2026-01-01\n# public key: age1qqq\nAGE-SECRET-KEY-1"
        + b"Q" * 58
        + b"\n",
    }
    for rel, data in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_bytes(data)
    assert len(files["server_bundle"]) - len(ec) > 4096
    # what only looks like one: not covered
    (work / "notes.yaml").write_text("private: false\nkey: value\n")
    (work / "nginx.conf").write_text("server { listen 80; }\n")
    got = found(work)
    assert set(got) == set(files), got
