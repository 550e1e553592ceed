"""A directory of a writable tree the walk cannot list (docs/design.md, "The guard is
live"): nothing in it is seen, so no credential there is covered, and the live guard
cannot watch it (inotify wants the right to read); the payload, the directory's
owner, may still reach into it (it needs only the search bit, or chmods it back). An
earlier run's payload leaves such a directory where a tool saves a credential."""

from __future__ import annotations

import os

import pytest

from tests.conftest import Boxy
from tests.escape.conftest import describe, output, run_py

pytestmark = pytest.mark.sandbox

READ = """
try:
    got = open(sys.argv[1]).read()
except OSError as e:
    tried("read", ename(e))
else:
    tried("read", f"read:{len(got)}")
    if "saved-by-a-tool" in got:
        escaped("read a credential in a directory the walk could not list", got.strip())
"""


def test_a_credential_in_a_directory_you_cannot_list_is_not_the_payloads(boxy: Boxy) -> None:
    """config/ made 0300 (write and search, no read) by an earlier run, a tool then
    saving config/.env there: the walk could not list it, so the run covered nothing
    in it and said nothing, and the payload read .env by its name."""
    config = boxy.workdir / "config"
    config.mkdir()
    (config / ".env").write_text("TOKEN=saved-by-a-tool\n")
    boxy.user.chown(boxy.workdir)
    os.chmod(config, 0o300)
    try:
        r = run_py(boxy, READ, args=("config/.env",), input=b"")
    finally:
        os.chmod(config, 0o700)
    out = output(r)
    assert "ESCAPED" not in out, describe(r)
    assert r.returncode != 0 and "a directory you cannot list" in out, describe(r)
