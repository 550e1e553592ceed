"""Credentials in the work directory are covered by default (the review's §2): a CI
checkout's token in .git/config, registry tokens in .npmrc/.yarnrc.yml/.pypirc, .netrc,
.git-credentials, a Docker config, .env files, private keys, .aws/. The payload reads
every one it can find; none of the secrets may come back, and what the tools need
(a project .npmrc's registry, git's remotes) still works."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Boxy, User
from tests.escape.conftest import describe, git, init_repo, run_py

pytestmark = pytest.mark.sandbox

SECRET = "boxySECRETtoken"
PEM = f"-----BEGIN OPENSSH PRIVATE KEY-----\n{SECRET}\n-----END OPENSSH PRIVATE KEY-----\n"
FILES = {
    ".npmrc": f"registry=https://npm.internal.example/\n//npm.internal.example/:_authToken={SECRET}\n",
    "sub/.yarnrc.yml": f'npmRegistryServer: "https://r.example"\nnpmAuthToken: {SECRET}\n',
    ".pypirc": f"[pypi]\nusername = __token__\npassword = {SECRET}\n",
    ".netrc": f"machine api.example login bob password {SECRET}\n",
    ".git-credentials": f"https://bob:{SECRET}@git.example\n",
    ".docker/config.json": json.dumps({"auths": {"r.example": {"auth": SECRET}}}),
    ".env": f"API_KEY={SECRET}\n",
    "app/.env.production": f"DB_PASSWORD={SECRET}\n",
    "deploy/id_ed25519": PEM,
    "tls/server.key": PEM.replace("OPENSSH ", ""),
    "tls/server.pem": PEM.replace("OPENSSH ", "RSA "),
    "keys.p12": SECRET,
    "gcp/credentials.json": json.dumps({"private_key": SECRET}),
    ".aws/credentials": f"[default]\naws_secret_access_key = {SECRET}\n",
}
KEPT = {  # not credentials: shown as they are
    ".env.example": "API_KEY=changeme\n",
    "tls/ca.pem": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    "deploy/id_ed25519.pub": "ssh-ed25519 AAAA user@host\n",
    "node_modules/pkg/test/key.pem": PEM,  # from the registry: public by definition
}

READER = """
import subprocess
secret = sys.argv[1]
hits = []
for dirpath, dirs, files in os.walk("."):
    for name in files:
        path = os.path.join(dirpath, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            tried("read", f"{path}:{ename(e)}")
            continue
        if "node_modules" in path:
            continue  # not searched, on purpose (see KEPT)
        if secret.encode() in data:
            escaped("read", path)
        # and none can be replaced or written through
        try:
            with open(path, "ab") as f:
                f.write(b"x")
        except OSError:
            pass
        else:
            if os.path.basename(path) in (".env", ".npmrc", "config"):
                escaped("write", path)
cfg = subprocess.run(["git", "config", "--get", "remote.origin.url"], capture_output=True, text=True)
tried("remote", cfg.stdout.strip())
if secret in subprocess.run(["git", "config", "--list"], capture_output=True, text=True).stdout:
    escaped("git-config", "the token is in git's view of the config")
for label, fn in (("rename-env", lambda: os.rename(".env", ".env.old")),
                  ("unlink-npmrc", lambda: os.unlink(".npmrc"))):
    try:
        fn()
    except OSError as e:
        tried(label, ename(e))
    else:
        escaped(label, "a covered entry was moved away")
with open(".npmrc") as f:
    tried("npmrc", f.read().strip().replace("\\n", "|"))
"""


def _project(user: User, workdir: Path) -> Path:
    repo = init_repo(user, workdir)
    git(user, repo, "remote", "add", "origin", f"https://x-access-token:{SECRET}@github.example/o/r.git")
    git(user, repo, "config", "http.https://github.example/.extraheader", f"AUTHORIZATION: basic {SECRET}")
    for rel, text in {**FILES, **KEPT}.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    user.chown(repo)
    return repo


def test_credentials_in_the_work_tree_are_covered(boxy: Boxy, user: User, workdir: Path) -> None:
    repo = _project(user, workdir)
    before = {rel: (repo / rel).read_bytes() for rel in FILES}
    r = run_py(boxy, READER, "-v", args=(SECRET,))
    assert "ESCAPED" not in r.stdout.decode(), describe(r)
    assert r.returncode == 0, describe(r)
    out = r.stdout.decode()
    assert "TRIED remote https://github.example/o/r.git" in out, describe(r)  # git still works
    assert "TRIED npmrc registry=https://npm.internal.example/" in out, describe(r)
    assert "TRIED rename-env EBUSY" in out and "TRIED unlink-npmrc EBUSY" in out, describe(r)
    err = r.stderr.decode()
    assert f"boxyctl: {len(FILES) + 1} credential files masked" in err, describe(r)  # + .git/config
    for rel in FILES:
        assert (repo / rel).read_bytes() == before[rel], f"{rel} changed on the host"
    for rel in KEPT:
        assert rel not in err, f"{rel} is not a credential, yet it was covered\n{describe(r)}"
    assert git(user, repo, "config", "--get", "remote.origin.url").stdout.decode().strip().endswith(
        f"{SECRET}@github.example/o/r.git")  # the host's own config is untouched


def test_reveal_shows_one_and_only_that_one(boxy: Boxy, user: User, workdir: Path) -> None:
    repo = _project(user, workdir)
    r = boxy.sh("cat .npmrc; echo; cat .env", "--reveal", ".npmrc")
    assert r.returncode == 0, describe(r)
    out = r.stdout.decode()
    assert f"_authToken={SECRET}" in out, describe(r)  # asked for: readable
    assert f"API_KEY={SECRET}" not in out, describe(r)  # the rest stays covered
    assert f"boxyctl: {len(FILES)} credential files masked" in r.stderr.decode(), describe(r)
    assert (repo / ".npmrc").exists()
