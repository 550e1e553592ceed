"""Credentials in the work directory are covered by default (the review's §2): a CI
checkout's token in .git/config, registry tokens in .npmrc/.yarnrc.yml/.pypirc, .netrc,
.git-credentials, a Docker config, .env files, private keys, .aws/. The payload reads
every one it can find; none of the secrets may come back, and what the tools need
(a project .npmrc's registry, git's remotes) still works."""

from __future__ import annotations

import json
import os
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
    git(
        user,
        repo,
        "remote",
        "add",
        "origin",
        f"https://x-access-token:{SECRET}@github.example/o/r.git",
    )
    git(
        user,
        repo,
        "config",
        "http.https://github.example/.extraheader",
        f"AUTHORIZATION: basic {SECRET}",
    )
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
    assert (
        git(user, repo, "config", "--get", "remote.origin.url")
        .stdout.decode()
        .strip()
        .endswith(f"{SECRET}@github.example/o/r.git")
    )  # the host's own config is untouched


def test_reveal_shows_one_and_only_that_one(boxy: Boxy, user: User, workdir: Path) -> None:
    repo = _project(user, workdir)
    r = boxy.sh("cat .npmrc; echo; cat .env", "--reveal", ".npmrc")
    assert r.returncode == 0, describe(r)
    out = r.stdout.decode()
    assert f"_authToken={SECRET}" in out, describe(r)  # asked for: readable
    assert f"API_KEY={SECRET}" not in out, describe(r)  # the rest stays covered
    assert f"boxyctl: {len(FILES)} credential files masked" in r.stderr.decode(), describe(r)
    assert (repo / ".npmrc").exists()


# §5: the other ecosystems' credential files, git's included configs, the profile's own
# patterns — all read by one payload in one run
MORE = {
    "ci/auth.inc": f'[http "https://github.example/"]\n\textraheader = AUTHORIZATION: basic {SECRET}\n',
    ".venv/pip.conf": f"[global]\nindex-url = https://__token__:{SECRET}@pypi.internal.example/simple\n",
    ".yarnrc": f'registry "https://npm.internal.example/"\n"//npm.internal.example/:_authToken" {SECRET}\n',
    "php/auth.json": json.dumps(
        {"http-basic": {"repo.example": {"username": "u", "password": SECRET}}}
    ),
    ".cargo/credentials.toml": f'[registry]\ntoken = "{SECRET}"\n',
    ".cargo/config.toml": f'[registries.corp]\nindex = "sparse+https://c.example/"\ntoken = "{SECRET}"\n',
    "poetry.toml": f'[http-basic.corp]\nusername = "u"\npassword = "{SECRET}"\n',
    ".gem/credentials": f"---\n:rubygems_api_key: {SECRET}\n",
    ".bundle/config": f'---\nBUNDLE_GEMS__EXAMPLE__COM: "u:{SECRET}"\n',
    ".azure/accessTokens.json": json.dumps([{"accessToken": SECRET}]),
    ".config/gcloud/credentials.db": SECRET,
    ".terraformrc": f'credentials "app.terraform.example" {{\n  token = "{SECRET}"\n}}\n',
    ".terraform.d/credentials.tfrc.json": json.dumps({"credentials": {"x": {"token": SECRET}}}),
    "rails/config/master.key": SECRET,
    "rails/config/credentials/production.key": SECRET,
    ".kube/config": f"users:\n- name: u\n  user:\n    token: {SECRET}\n",
    "deploy/kubeconfig": f"users:\n- name: u\n  user:\n    client-key-data: |\n      {SECRET}\n",
    "_netrc": f"machine m.example login bob password {SECRET}\n",
    "conf/db.secret": SECRET,  # the profile's own pattern
    # held too (org.gradle.java.home): the pin is of the scrubbed copy
    "gradle.properties": f"org.gradle.jvmargs=-Xmx1g\nossrh\\\n  Password={SECRET}\n",
    "android/keystore.properties": f"storeFile=r.jks\nstorePassword={SECRET}\n",
    "android/release.jks": SECRET,
    # a second attack round (issue 31): npm's ini array, flow mappings, a helper that
    # prints the password, a Vim swap of a covered file, cookiecutter's .envs, Rails'
    # secrets.yml, an App Store Connect key
    "web/.npmrc": f"//npm.internal.example/:_authToken[]={SECRET}\n",
    "k8s/.kube/config": f"users:\n- name: dev\n  user: {{token: {SECRET}}}\n",
    "crate/.cargo/config.toml": f'[registries]\ncorp = {{ index = "sparse+https://c.example/", token = "{SECRET}" }}\n',
    "sub/.git-credentials": f"https://u:{SECRET}@git.example\n",
    ".credentials.json.swp": json.dumps({"private_key": SECRET}),
    ".envs/.production/.django": f"DJANGO_SECRET_KEY={SECRET}\n",
    "rails/config/secrets.yml": f"production:\n  secret_key_base: {SECRET}\n",
    "ios/AuthKey_7Q2X.p8": PEM.replace("OPENSSH ", ""),
}


def test_every_ecosystem_and_includes_in_one_run(boxy: Boxy, user: User, workdir: Path) -> None:
    repo = init_repo(user, workdir)
    git(user, repo, "config", "--add", "include.path", "../ci/auth.inc")
    helper = f"!f() {{ echo username=x; echo password={SECRET}; }}; f"  # as CI scripts write
    git(user, repo, "config", "credential.helper", helper)
    for rel, text in {**FILES, **MORE}.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    profile = workdir.parent / f"{workdir.name}-secrets.yaml"
    profile.write_text("filesystem:\n  secrets: ['*.secret']\n")
    user.chown(repo)
    user.chown(profile)
    # the host's git does read the token through the include
    assert SECRET in git(user, repo, "config", "--list").stdout.decode()
    r = run_py(boxy, READER, "-v", "--profile", str(profile), args=(SECRET,))
    assert "ESCAPED" not in r.stdout.decode(), describe(r)
    assert r.returncode == 0, describe(r)
    err = r.stderr.decode()
    dirs = {
        ".azure/accessTokens.json": ".azure",
        ".config/gcloud/credentials.db": ".config/gcloud",
        ".envs/.production/.django": ".envs",
    }
    for rel in MORE:
        said = dirs.get(rel, rel)
        assert f"{repo}/{said}:" in err, f"{said} not said under -v\n{describe(r)}"
    assert "TRIED npmrc registry=https://npm.internal.example/" in r.stdout.decode(), describe(r)


# linked under another name, then renamed: the live guard covers a .env.local the moment
# it appears, and a link to a mount point would fail (EXDEV)
LINK = """set -e
touch later
mkdir -p node_modules/.cache
ln later node_modules/.cache/e
mv later .env.local
echo TRIED linked
"""


def test_a_hard_link_planted_earlier_is_covered_too(boxy: Boxy, user: User, workdir: Path) -> None:
    r = boxy.sh(LINK)
    assert r.returncode == 0 and b"TRIED linked" in r.stdout, describe(r)
    with open(workdir / ".env.local", "a") as f:  # the user adds a key later, in place
        f.write(f"API_KEY={SECRET}\n")
    assert (
        SECRET in (workdir / "node_modules/.cache/e").read_text()
    )  # the link shows it on the host
    r = boxy.sh(
        "cat node_modules/.cache/e .env.local; echo; echo TRIED read; "
        "echo x >> node_modules/.cache/e || echo TRIED write-refused",
        "-v",
        "--audit-log",
        "audit.jsonl",
    )
    assert SECRET not in r.stdout.decode(), "ESCAPED the key through a hard link\n" + describe(r)
    assert b"TRIED read" in r.stdout and b"TRIED write-refused" in r.stdout, describe(r)
    err = r.stderr.decode()
    assert (
        f"{workdir}/node_modules/.cache/e: environment file, shown as an empty stand-in "
        "(a hard link of .env.local)" in err
    ), describe(r)
    assert (
        f"{workdir}/.env.local: environment file, shown as an empty stand-in (2 hard links: "
        "also node_modules/.cache/e)" in err
    ), describe(r)
    records = [json.loads(x) for x in (workdir / "audit.jsonl").read_text().splitlines()]
    notes = {x["path"]: x.get("note") for x in records if x.get("layer") == "fs.secret"}
    assert notes[f"{workdir}/node_modules/.cache/e"] == "a hard link of .env.local", notes
    assert SECRET in (workdir / ".env.local").read_text()  # the host's file untouched


def test_a_link_outside_the_tree_is_said(boxy: Boxy, user: User, workdir: Path) -> None:
    (workdir / ".env").write_text(f"API_KEY={SECRET}\n")
    outside = workdir.parent / f"{workdir.name}-env-link"
    os.link(workdir / ".env", outside)
    user.chown(workdir)
    try:
        r = boxy.sh("cat .env; echo TRIED read", "-v")
        assert SECRET not in r.stdout.decode() and b"TRIED read" in r.stdout, describe(r)
        assert (
            "1 outside the tree (not shown to the payload, but not covered there)"
            in r.stderr.decode()
        ), describe(r)
    finally:
        outside.unlink()


def test_more_credentials_than_mounts_refuse_the_next_run_at_once(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    """issue #30 §3: a payload that leaves 5,000 credential files (made where the walk
    does not look, then moved in) made every later run build 5,000 mounts; at 110,000
    the mount table ran out mid-start (exit 125 after 13 s, every time). Past
    FOUND_MAX the run is refused with one line, before anything is mounted."""
    plant = (
        "import os\nos.makedirs('node_modules/x')\n"
        "for i in range(5000):\n    open(f'node_modules/x/.env.{i}', 'w').close()\n"
        "os.rename('node_modules/x', 'x')\n"
    )
    r = boxy.run("--net", "none", cmd=["python3", "-c", plant], timeout=120)
    assert r.returncode in (0, 137), describe(r)  # the live guard may stop it (1,024 new)
    r = boxy.sh("echo the-payload-ran")
    assert r.returncode == 125, describe(r)
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "more than 4,096 credential files" in lines[0], lines
    assert b"the-payload-ran" not in r.stdout


KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAASECRETKEY\n-----END OPENSSH PRIVATE KEY-----\n"
ACCOUNT = (
    '{"type": "service_account", "project_id": "p", '
    '"private_key": "-----BEGIN PRIVATE KEY-----\\nSECRETKEY\\n-----END PRIVATE KEY-----\\n"}'
)


def test_keys_under_ordinary_names_are_covered(boxy: Boxy, user: User, workdir: Path) -> None:
    """Issue 31 §4: a deploy key and a service account's JSON under names that say
    nothing; found by what they hold."""
    (workdir / "ops").mkdir()
    (workdir / "ops/deploy_key").write_text(KEY)
    (workdir / "ops/prod-7f3a.json").write_text(ACCOUNT)
    user.chown(workdir)
    r = run_py(
        boxy,
        """
for p in ("ops/deploy_key", "ops/prod-7f3a.json"):
    data = read(p, p)
    if data and b"SECRETKEY" in data:
        escaped(p, "the key was read")
""",
    )
    assert r.returncode == 0 and b"ESCAPED" not in r.stdout, describe(r)
    assert b"TRIED ops/deploy_key read:0" in r.stdout, describe(r)
    assert b"TRIED ops/prod-7f3a.json read:0" in r.stdout, describe(r)
    assert (workdir / "ops/deploy_key").read_text() == KEY  # the user's file is the user's
