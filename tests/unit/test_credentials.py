"""credentials.py: which entries of a work tree are covered, and what the scrubbed copies
keep (pure)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from boxyd.plan import credentials as c
from boxyd.plan.credentials import Action


@pytest.mark.parametrize(
    "parent,name,is_dir,kind,action",
    [
        ("proj", ".npmrc", False, "npm config", Action.SCRUB),
        ("proj", ".yarnrc.yml", False, "yarn config", Action.SCRUB),
        ("proj", ".pypirc", False, "PyPI config", Action.SCRUB),
        ("proj", ".netrc", False, "netrc", Action.SCRUB),
        ("proj", ".git-credentials", False, "git credentials", Action.SCRUB),
        (".docker", "config.json", False, "Docker config", Action.SCRUB),
        ("proj", ".env", False, "environment file", Action.EMPTY),
        ("proj", ".env.local", False, "environment file", Action.EMPTY),
        ("proj", ".env.production", False, "environment file", Action.EMPTY),
        ("proj", "id_rsa", False, "private key", Action.EMPTY),
        ("proj", "id_ed25519_deploy", False, "private key", Action.EMPTY),
        ("proj", "id_ecdsa", False, "private key", Action.EMPTY),
        ("proj", "server.pem", False, "private key", Action.EMPTY),
        ("proj", "tls.KEY", False, "private key", Action.EMPTY),
        ("proj", "cert.p12", False, "PKCS#12 key store", Action.EMPTY),
        ("proj", "store.pfx", False, "PKCS#12 key store", Action.EMPTY),
        ("proj", "credentials.json", False, "credentials file", Action.EMPTY),
        ("proj", ".aws", True, "AWS credentials", Action.EMPTY),
    ],
)
def test_covered(parent: str, name: str, is_dir: bool, kind: str, action: Action) -> None:
    rule = c.rule_for(parent, name, is_dir)
    assert rule is not None and (rule.kind, rule.action, rule.is_dir) == (kind, action, is_dir)


@pytest.mark.parametrize(
    "parent,name,is_dir",
    [
        ("proj", ".env.example", False),
        ("proj", ".env.sample", False),
        ("proj", ".env.template", False),
        ("proj", ".env.dist", False),
        ("proj", ".env.Example", False),
        ("proj", "id_rsa.pub", False),
        ("proj", "id_ed25519.PUB", False),
        ("proj", "config.json", False),  # not under .docker
        ("proj", ".npmrc", True),
        ("proj", ".env", True),  # directories of those names
        ("proj", ".aws", False),
        ("proj", "environment", False),
        ("proj", "package.json", False),
        ("proj", ".env.example", False),
        ("proj", ".env-sample", False),
        ("proj", "example.env", False),
        ("proj", ".environment", False),
        ("proj", "index.js.bak", False),  # a copy of what is not covered
        ("proj", "notes~", False),
        ("proj", "#draft#", False),
    ],
)
def test_not_covered(parent: str, name: str, is_dir: bool) -> None:
    assert c.rule_for(parent, name, is_dir) is None


@pytest.mark.parametrize(
    "head,private",
    [
        (b"-----BEGIN RSA PRIVATE KEY-----\nMIIE", True),
        (b"junk\n-----BEGIN OPENSSH PRIVATE KEY-----\n", True),
        (b"-----BEGIN PRIVATE KEY-----\n", True),
        (b"-----BEGIN ENCRYPTED PRIVATE KEY-----\n", True),
        (b"-----BEGIN EC PRIVATE KEY-----\n", True),
        (b"-----BEGIN CERTIFICATE-----\nMIIB", False),
        (b"-----BEGIN PUBLIC KEY-----\n", False),
    ],
)
def test_pem_content(head: bytes, private: bool) -> None:
    assert c.holds_private_key(head) is private


def test_npmrc_keeps_the_registry_drops_every_token() -> None:
    data = (
        b"registry=https://npm.internal.example/\n"
        b"//npm.internal.example/:_authToken=npm_SECRET1\n"
        b"_auth = dXNlcjpTRUNSRVQy\n"
        b"//other.example/:_password=U0VDUkVUMw==\n"
        b"//other.example/:username=bob\n"
        b"@scope:registry=https://user:SECRET4@scoped.example/\n"
        b"always-auth=true\n"
    )
    out = c.scrub_npmrc(data)
    assert b"SECRET" not in out and b"dXNlcjpTRUNSRVQy" not in out and b"U0VDUkVUMw" not in out
    assert b"registry=https://npm.internal.example/\n" in out
    assert b"@scope:registry=https://scoped.example/\n" in out
    assert b"always-auth=true" in out


def test_npmrc_keeps_a_token_that_names_the_environment() -> None:
    """`_authToken=${NPM_TOKEN}` holds no secret: npm reads the variable, which the run
    passes (--secret NAME@HOST: the placeholder). Anything beside the reference goes."""
    data = (
        b"//r.example/:_authToken=${NPM_TOKEN}\n"
        b"//s.example/:_authToken = ${NPM_TOKEN?} \r\n"
        b"//t.example/:_authToken=${NPM_TOKEN}SECRET1\n"
        b"//u.example/:_authToken=SECRET2${NPM_TOKEN}\n"
        b"//v.example/:_password=${A}${B}SECRET3\n"
        b"_auth=${1BAD}SECRET4\n"
    )
    out = c.scrub_npmrc(data)
    assert b"SECRET" not in out, out
    assert (
        out == b"//r.example/:_authToken=${NPM_TOKEN}\n//s.example/:_authToken = ${NPM_TOKEN?} \r\n"
    )


def test_npmrc_keys_are_read_as_npm_reads_them() -> None:
    """npm's ini decodes a key as it decodes a value: a quoted key is unquoted (JSON
    escapes included), and npm sends the token under it (checked with npm itself when
    this was found). Each of these must go."""
    data = (
        b'"//r.example/:_authToken"=SECRET1\n'
        b"'//r.example/:_password' = SECRET2\n"
        b'"//r.example/:\\u005fauth"=SECRET3\n'
        b'  "_AUTHTOKEN"   =SECRET4\n'
        b'"//r.example/:username"=bob\n'
    )
    out = c.scrub_npmrc(data)
    assert b"SECRET" not in out, out
    assert b"username" in out


def test_yarnrc_pypirc_netrc_git_credentials() -> None:
    yarn = c.scrub_yarnrc(
        b'npmRegistryServer: "https://r.example"\nnpmAuthToken: SECRET1\n'
        b'npmScopes:\n  corp:\n    npmAuthIdent: "u:SECRET2"\n    npmAlwaysAuth: true\n'
    )
    assert b"SECRET" not in yarn and b"npmRegistryServer" in yarn and b"npmAlwaysAuth" in yarn
    pypi = c.scrub_pypirc(
        b"[pypi]\nusername = __token__\npassword = pypi-SECRET\n[testpypi]\n"
        b"repository = https://test.example/legacy/\n"
    )
    assert b"SECRET" not in pypi and b"repository = https://test.example/legacy/" in pypi
    netrc = c.scrub_netrc(
        b"machine api.example login bob password SECRET1\n"
        b"machine x.example\n  login alice\n  password SECRET2 account SECRET3\n"
    )
    assert b"SECRET" not in netrc and b"machine api.example login bob" in netrc
    creds = c.scrub_urls(
        b"https://bob:ghp_SECRET@github.example\nhttps://x-token:SECRET2@gitlab.example\n"
    )
    assert creds == b"https://github.example\nhttps://gitlab.example\n"


def test_docker_config() -> None:
    doc = {
        "auths": {
            "r.example": {"auth": "U0VDUkVU", "email": "a@b"},
            "q.example": {"identitytoken": "SECRET"},
        },
        "credsStore": "desktop",
    }
    out = json.loads(c.scrub_docker_config(json.dumps(doc).encode()))
    assert out == {
        "auths": {"r.example": {"email": "a@b"}, "q.example": {}},
        "credsStore": "desktop",
    }
    assert c.scrub_docker_config(b"not json") == b"{}\n"


GIT_CONFIG = b"""[core]
\trepositoryformatversion = 0
[remote "origin"]
\turl = https://x-access-token:ghs_SECRET1@github.example/org/repo.git
\tfetch = +refs/heads/*:refs/remotes/origin/*
[http "https://github.example/"]
\textraheader = AUTHORIZATION: basic U0VDUkVUMg==
[http]
\tExtraHeader = "Authorization: Bearer SECRET3 \\
continued SECRET4"
\tsslVerify = true
[url "https://ci:SECRET5@git.example/"]
\tinsteadOf = https://git.example/
[credential "https://github.example"]
\tusername = bob-SECRET6
\thelper = store
[branch "main"]
\tremote = origin
"""


def test_git_config_scrubbed_and_still_read_by_git(tmp_path: Path) -> None:
    out = c.scrub_git_config(GIT_CONFIG)
    assert b"SECRET" not in out and b"U0VDUkVUMg" not in out
    path = tmp_path / "config"
    path.write_bytes(out)
    r = subprocess.run(
        ["git", "config", "--file", str(path), "--list"], capture_output=True, text=True, check=True
    )
    keys = dict(line.split("=", 1) for line in r.stdout.splitlines())
    assert keys["remote.origin.url"] == "https://github.example/org/repo.git"
    assert keys["branch.main.remote"] == "origin"
    assert keys["http.sslverify"] == "true"
    assert keys["url.https://git.example/.insteadof"] == "https://git.example/"
    # a helper may be a shell line that prints the password: none is kept (the
    # sandbox reaches none of the host's credential stores anyway)
    assert not any("extraheader" in k or k.endswith((".username", ".helper")) for k in keys)


def test_git_config_key_on_the_header_line() -> None:
    assert b"SECRET" not in c.scrub_git_config(b"[http] extraheader = Authorization: SECRET\n")


# --- the table: every row, with a file of its kind holding a secret ---------------------

S = "SECRETvalue"
ROWS: list[tuple[str, str, str, str | None]] = [  # parent, name, content, kept (None: empty)
    ("p", ".git-credentials", f"https://bob:{S}@git.example\n", "https://git.example"),
    ("p", ".npmrc", f"registry=https://r.example/\n//r.example/:_authToken={S}\n", "registry="),
    (
        "p",
        ".yarnrc",
        f'registry "https://r.example/"\n"//r.example/:_authToken" {S}\n_auth {S}\n',
        'registry "https://r.example/"',
    ),
    (
        "p",
        ".yarnrc.yml",
        f"npmRegistryServer: https://r.example\nnpmScopes:\n  corp:\n"
        f"    npmAuthToken: >-\n      {S}\n    npmAlwaysAuth: true\nnpmAuthIdent: {S}\n",
        "npmAlwaysAuth",
    ),
    (
        "p",
        "pip.conf",
        f"[global]\nindex-url = https://__token__:{S}@i.example/simple\n"
        f"extra-index-url =\n    https://u:{S}@x.example/simple\n",
        "https://i.example/simple",
    ),
    ("p", "pip.ini", f"[global]\nindex-url = https://u:{S}@i.example/simple\n", "i.example"),
    ("p", ".pypirc", f"[pypi]\nusername = __token__\npassword = {S}\n", "username"),
    (
        "p",
        "poetry.toml",
        f'[virtualenvs]\nin-project = true\n[http-basic.corp]\nusername = "bob"\n'
        f'password = "{S}"\n[pypi-token]\npypi = "{S}"\n',
        "in-project",
    ),
    (
        "pypoetry",
        "auth.toml",
        f'http-basic.corp.password = "{S}"\npypi-token.pypi = "{S}"\n'
        'http-basic.corp.username = "bob"\n',
        "username",
    ),
    (
        "p",
        "auth.json",
        json.dumps(
            {
                "http-basic": {"r.example": {"username": "u", "password": S}},
                "github-oauth": {"github.example": S},
                "bearer": {"x": S},
            }
        ),
        None,
    ),
    ("p", ".netrc", f"machine m.example login bob password {S}\n", "machine m.example"),
    ("p", "_netrc", f"machine m.example login bob password {S}\n", "machine m.example"),
    (
        "p",
        ".terraformrc",
        f'plugin_cache_dir = "/c"\ncredentials "app.example" {{\n  token = "{S}"\n}}\n',
        "plugin_cache_dir",
    ),
    ("p", "terraform.rc", f'credentials "app.example" {{ token = "{S}" }}\n', "credentials"),
    (
        "p",
        "kubeconfig",
        f"clusters:\n- cluster:\n    server: https://k.example\nusers:\n- name: u\n"
        f"  user:\n    token: {S}\n    client-key-data: |\n      {S}\n",
        "server: https://k.example",
    ),
    (
        "p",
        "kubeconfig.yaml",
        f"users:\n- user:\n    password: {S}\n    username: bob\n",
        "username",
    ),
    (
        "p",
        "kubeconfig.yml",
        f"users:\n- user:\n    auth-provider:\n      config:\n"
        f"        refresh-token: {S}\n        id-token: {S}\n        client-secret: {S}\n",
        "auth-provider",
    ),
    (
        "p",
        "prod.kubeconfig",
        json.dumps({"users": [{"user": {"token": S}}], "kind": "Config"}),
        "Config",
    ),
    ("p", ".my.cnf", f"[client]\nuser = bob\npassword = {S}\n", "user = bob"),
    ("p", "credentials.json", json.dumps({"private_key": S}), None),
    ("p", "application_default_credentials.json", json.dumps({"refresh_token": S}), None),
    ("p", ".pgpass", f"db.example:5432:*:bob:{S}\n", None),
    ("p", ".vault-token", S, None),
    (
        ".docker",
        "config.json",
        json.dumps({"auths": {"r.example": {"auth": S}}, "credsStore": "x"}),
        "credsStore",
    ),
    (".cargo", "credentials", f'[registry]\ntoken = "{S}"\n', None),
    (".cargo", "credentials.toml", f'[registries.corp]\ntoken = "{S}"\n', None),
    (".cargo", "config", f'[registry]\ntoken = "{S}"\n[build]\njobs = 2\n', "jobs = 2"),
    (
        ".cargo",
        "config.toml",
        f'[registries.corp]\nindex = "sparse+https://c.example/"\ntoken = "{S}"\n'
        f'secret-key = "{S}"\n',
        "index =",
    ),
    (".gem", "credentials", f"---\n:rubygems_api_key: {S}\n", None),
    (
        ".bundle",
        "config",
        f'---\nBUNDLE_PATH: "vendor/bundle"\nBUNDLE_GEMS__EXAMPLE__COM: "u:{S}"\n',
        "BUNDLE_PATH",
    ),
    (".kube", "config", f"users:\n- name: u\n  user:\n    token: {S}\n", "name: u"),
    (
        ".terraform.d",
        "credentials.tfrc.json",
        json.dumps({"credentials": {"app.example": {"token": S}}}),
        None,
    ),
    ("config", "master.key", S, None),
    ("credentials", "production.key", S, None),
    ("gh", "hosts.yml", f"github.example:\n    oauth_token: {S}\n", None),
    ("p", ".envrc", f"export TOKEN={S}\n", None),
    ("p", "terraform.tfstate", f'{{"resources": [{{"password": "{S}"}}]}}', None),
    ("p", "terraform.tfstate.backup", f'{{"password": "{S}"}}', None),
    ("p", ".dev.vars", f"API_KEY={S}\n", None),
    ("p", ".s3cfg", f"[default]\nsecret_key = {S}\n", None),
    ("p", "rclone.conf", f"[r]\ntype = s3\nsecret_access_key = {S}\n", None),
    ("p", ".sentryclirc", f"[auth]\ntoken={S}\n", None),
    ("p", ".databrickscfg", f"[DEFAULT]\ntoken = {S}\n", None),
    ("p", ".dockercfg", f'{{"r.example": {{"auth": "{S}"}}}}', None),
    (".kaggle", "kaggle.json", f'{{"username": "u", "key": "{S}"}}', None),
    (".streamlit", "secrets.toml", f'db_password = "{S}"\n', None),
    (".m2", "settings.xml", f"<settings><servers><server><password>{S}</password>", None),
    (".m2", "settings-security.xml", f"<settingsSecurity><master>{S}</master>", None),
    (
        "p",
        "gradle.properties",
        f"org.gradle.jvmargs=-Xmx2g\nossrhPassword={S}\nsigning.password : {S}\n"
        f"gradle.publish.key {S}\nmavenSecretKey={S}\nmavenSessionToken={S}\n"
        f"corpAuthHeaderValue={S}\nsigningInMemoryKey={S}\n",
        "org.gradle.jvmargs=-Xmx2g",
    ),
    ("p", "local.properties", f"sdk.dir=/opt/sdk\nMAPS_API_KEY={S}\n", "sdk.dir"),
    (
        "p",
        "keystore.properties",
        f"storeFile=k.jks\nstorePassword={S}\nkeyPassword={S}\n",
        "storeFile",
    ),  # fmt: skip
    ("p", "signing.properties", f"keyAlias=a\nkeyPassword={S}\n", "keyAlias"),
    ("p", "release.jks", S, None),
    ("config", "secrets.yml", f"production:\n  secret_key_base: {S}\n", None),
    ("p", "debug.keystore", S, None),
]


# Keys as java.util.Properties.load reads them (its LineReader and loadConvert): a key
# written with escapes, split over lines, or ended by a blank is the key Gradle gets.
@pytest.mark.parametrize(
    "text",
    [
        f"signing.\\u0070assword={S}\n",  # \uXXXX in the key
        f"ossrh\\\n    Password={S}\n",  # a key continued on the next line
        f"  \t\fossrhPassword\t{S}\n",  # leading blanks, ended by a tab
        f"ossrhPassword:{S}\n",
        f"ossrhPassword={S}\\\n  {S}\n",  # the value's continuation goes with it
        f"ossrhPassword={S}\\\r{S}\r",  # \r alone ends a line
        f"o\\s\\s\\r\\h\\P\\a\\s\\s\\word={S}\n",  # \X is X
        f"# c \\\nossrhPassword={S}\n",  # a comment's backslash continues nothing
    ],
)
def test_java_properties_keys_as_java_reads_them(text: str) -> None:
    out = c.scrub_java_properties(text.encode())
    assert S.encode() not in out, out


def test_java_properties_an_even_backslash_run_ends_the_line() -> None:
    out = c.scrub_java_properties(f"path=C:\\\\\nossrhPassword={S}\nkept=1\n".encode())
    assert out == b"path=C:\\\\\nkept=1\n", out


@pytest.mark.parametrize("parent,name,content,kept", ROWS, ids=[f"{r[0]}/{r[1]}" for r in ROWS])
def test_every_row_covers_its_secret(
    parent: str, name: str, content: str, kept: str | None
) -> None:
    rule = c.rule_for(parent, name, False)
    assert rule is not None
    if kept is None and rule.action is Action.EMPTY:
        assert not rule.is_dir
        return  # an empty stand-in: nothing of it shown
    assert rule.action is Action.SCRUB
    out = c.scrub(rule, content.encode())
    assert S.encode() not in out, out
    if kept is not None:
        assert kept.encode() in out, out


@pytest.mark.parametrize(
    "name,kind",
    [
        (".env~", "environment file"),
        (".env-backup", "environment file"),
        (".env_old", "environment file"),
        ("prod.env", "environment file"),
        ("prod.tfvars", "Terraform variables"),
        ("secrets.auto.tfvars.json", "Terraform variables"),
        (".npmrc.bak", "copy of a npm config"),
        (".npmrc~", "copy of a npm config"),
        (".pypirc.orig", "copy of a PyPI config"),
        ("#.pgpass#", "copy of a PostgreSQL passwords"),
        (".git-credentials.old", "copy of a git credentials"),
        ("id_rsa.swp", "private key"),  # its own name covers it already
        ("kubeconfig-backup", "copy of a kubeconfig"),
    ],
)
def test_copies_and_variants_are_covered(name: str, kind: str) -> None:
    rule = c.rule_for("proj", name, False)
    assert rule is not None and rule.kind == kind and rule.action is Action.EMPTY, rule
    assert c.any_candidate(["index.js", name])


def test_the_table_is_all_tested() -> None:
    tested = {(p, n) for p, n, _, _ in ROWS}
    names = {n for _, n in tested}
    assert set(c._BY_NAME) <= names
    assert set(c._BY_PARENT) <= tested


@pytest.mark.parametrize(
    "parent,name,kind",
    [
        ("p", ".aws", "AWS credentials"),
        ("p", ".azure", "Azure CLI credentials"),
        ("p", ".envs", "environment files"),
        (".config", "gcloud", "gcloud credentials"),
    ],
)
def test_directories_covered_whole(parent: str, name: str, kind: str) -> None:
    rule = c.rule_for(parent, name, True)
    assert rule is not None and (rule.kind, rule.action, rule.is_dir) == (kind, Action.EMPTY, True)


@pytest.mark.parametrize(
    "parent,name,is_dir",
    [
        ("p", "gcloud", True),  # only under .config
        ("p", "master.key", False),  # a .key file elsewhere: a PEM check decides
        (".cargo", "registry", True),
        ("p", "config", False),
        ("p", "hosts.yml", False),
        ("p", "credentials", False),
        ("p", "config.toml", False),
        ("p", "auth.json", True),
    ],
)
def test_not_without_their_parent(parent: str, name: str, is_dir: bool) -> None:
    rule = c.rule_for(parent, name, is_dir)
    assert rule is None or rule.needs_content and rule.kind == "private key"


@pytest.mark.parametrize(
    "kind,data",
    [
        ("Composer auth", b'{"config": {"x": 1}}'),  # no credential in it: nothing to cover
        ("kubeconfig", b"clusters:\n- cluster:\n    server: https://k.example\n"),
        ("pip config", b"[global]\nindex-url = https://i.example/simple\n"),
        ("cargo config", b"[build]\njobs = 2\n"),
        ("Bundler config", b'---\nBUNDLE_MIRROR__HTTPS://RUBYGEMS__ORG/: "https://m.example"\n'),
        ("Terraform CLI config", b'plugin_cache_dir = "/c"\n'),
    ],
)
def test_nothing_to_remove_is_left_as_is(kind: str, data: bytes) -> None:
    assert c.scrub(c.Rule(kind, Action.SCRUB, needs_content=True), data) == data


def test_composer_not_json_shows_nothing() -> None:
    assert c.scrub_composer_auth(b"not json") == b"{}\n"
    assert c.scrub_composer_auth(b"[1]") == b"{}\n"


def test_yaml_block_value_goes_whole_and_siblings_stay() -> None:
    out = c.scrub_kubeconfig(
        b"users:\n- user:\n    token: |\n      a\n\n      b\n    username: u\n"
    )
    assert out == b"users:\n- user:\n    username: u\n"


def test_toml_multiline_token_goes_whole() -> None:
    out = c.scrub_toml(b'[registry]\ntoken = """\nSECRET\n"""\ndefault = "x"\n')
    assert out == b'[registry]\ndefault = "x"\n'


@pytest.mark.parametrize(
    "patterns,rel,is_dir,covered",
    [
        (["*.secret"], "a/b/db.secret", False, True),
        (["*.secret"], "db.secret.txt", False, False),
        (["conf/prod/*.yaml"], "conf/prod/db.yaml", False, True),
        (["conf/prod/*.yaml"], "x/conf/prod/db.yaml", False, False),  # a path: from the top
        (["vault"], "deploy/vault", True, True),
        (["/keys/"], "keys", True, True),
        ([], ".env.whatever", False, False),
    ],
)
def test_user_patterns(patterns: list[str], rel: str, is_dir: bool, covered: bool) -> None:
    rule = c.user_rule(patterns, rel, is_dir)
    assert (rule is not None) is covered
    if rule is not None:
        assert (rule.action, rule.is_dir, rule.kind) == (Action.EMPTY, is_dir, c.USER_KIND)


def _names_rule_for_covers() -> list[tuple[str, str, bool]]:
    """(parent, name, is_dir) for every table entry and every pattern, in odd cases."""
    out = [("x", n, False) for n in c._BY_NAME] + [(p, n, False) for p, n in c._BY_PARENT]
    out += [("x", n, True) for n in c._DIRS] + [(p, n, True) for p, n in c._DIRS_BY_PARENT]
    for name in (".env", ".env.local", ".env.Production", "ID_RSA", "id_ed25519_work", "a.PEM",
                 "tls.key", "store.p12", "x.PFX", "prod.kubeconfig", "Prod.KUBECONFIG"):  # fmt: skip
        out.append(("credentials", name, False))
    return out


@pytest.mark.parametrize("parent,name,is_dir", _names_rule_for_covers())
def test_the_listing_prefilter_is_a_superset_of_rule_for(
    parent: str, name: str, is_dir: bool
) -> None:
    assert c.rule_for(parent, name, is_dir) is not None
    listing = ["index.js", "package.json", name, "README.md"]
    assert c.any_candidate(listing)
    assert c.any_candidate(["a\nb", name])  # a name with a newline hides nothing
    assert c.any_candidate({name: "file"})  # a listing is a dict of names


def test_the_listing_prefilter_passes_over_ordinary_directories() -> None:
    for listing in (["index.js", "package.json", "lib", "README.md"], [], ["keys", "pemmican"]):
        assert not c.any_candidate(listing)
        assert all(c.rule_for("x", n, False) is None for n in listing)


def test_git_send_email_password_is_scrubbed() -> None:
    out = c.scrub_git_config(f"[sendemail]\n\tsmtpServer = s\n\tsmtpPass = {S}\n".encode())
    assert S.encode() not in out and b"smtpServer = s" in out
