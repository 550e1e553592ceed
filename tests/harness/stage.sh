#!/usr/bin/env bash
# As root: stage this tree where an unprivileged user can read it (a clean clone may
# sit under /root, mode 0700), with a venv of its own, and give that user a runtime
# directory as a login would. Used by run-tests.sh (the suite) and bench/all.py.
#   tests/harness/stage.sh USER STAGE [SRC]     (SRC: another tree; default this one)
set -euo pipefail
user=$1
stage=$2
src=${3:-$(cd "$(dirname "$0")/../.." && pwd)}
id "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$user"
uid=$(id -u "$user")

# A root-owned, world-readable copy with its own venv (paths in a venv are absolute).
mkdir -p "$stage"
find "$stage" -mindepth 1 -maxdepth 1 ! -name .venv -exec rm -rf {} +
tar -C "$src" --exclude=./.venv --exclude=./.git --exclude='*/__pycache__' -cf - . | tar -C "$stage" -xf -
if [ ! -x "$stage/.venv/bin/python3" ]; then
  /usr/bin/python3 -m venv --copies --system-site-packages "$stage/.venv"
fi
if ! cmp -s "$src/pyproject.toml" "$stage/.venv/.pyproject" ; then
  "$stage/.venv/bin/pip" install -q -e "$stage[test]" --config-settings editable_mode=compat
  cp "$src/pyproject.toml" "$stage/.venv/.pyproject"
fi
"$stage/.venv/bin/python3" -m compileall -q "$stage/boxy" "$stage/boxyd" "$stage/boxyctl" >/dev/null
# boxyctl's own scripts, as `make venv` writes them (boxyctl/launcher.py); a tree from
# before them has none to write
if [ -f "$stage/boxyctl/launcher.py" ]; then
  "$stage/.venv/bin/python3" -I -m boxyctl.launcher "$stage/.venv/bin"  # -I: not the cwd's tree
fi
chmod -R a+rX "$stage"

# A runtime directory as a login would give the user.
install -d -m 0700 -o "$user" -g "$(id -g "$user")" "/run/user/$uid"
