#!/usr/bin/env bash
# Run the whole suite. As root (CI): sandboxes are exercised as an unprivileged test
# user, so the tree is staged where that user can read it (a clean clone may sit
# under /root, mode 0700) and pytest, still root for the harness's own setup steps,
# runs every `boxyctl` as that user. As a normal user: everything runs as you.
set -euo pipefail
venv=${1:-.venv}
shift || true
# the rest: pytest's own arguments (default: the whole suite)
(($#)) || set -- tests
src=$(cd "$(dirname "$0")/../.." && pwd)

if [ "$(id -u)" != 0 ]; then
  cd "$src"
  exec "$venv/bin/python3" -m pytest -q -p no:cacheprovider "$@"
fi

user=${BOXY_TEST_USER:-boxytest}
# another stage (BOXY_TEST_STAGE) lets a second suite run beside this one
stage=${BOXY_TEST_STAGE:-/opt/boxy-test}
id "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$user"
uid=$(id -u "$user")

# Stage a root-owned, world-readable copy with its own venv (paths in a venv are absolute).
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
# boxyctl's own scripts, as `make venv` writes them (boxyctl/launcher.py)
"$stage/.venv/bin/python3" -I -m boxyctl.launcher "$stage/.venv/bin"  # -I: not the cwd's tree
chmod -R a+rX "$stage"

# A runtime directory as a login would give the user.
install -d -m 0700 -o "$user" -g "$(id -g "$user")" "/run/user/$uid"

cd "$stage"
export BOXY_TEST_USER="$user"
set +e
"$stage/.venv/bin/python3" -m pytest -q -p no:cacheprovider "$@" &
pytest_pid=$!
wait "$pytest_pid"
rc=$?
set -e
# Leave no daemon of this suite behind (only this venv's: other suites may be running).
pkill -u "$user" -f "^$stage/.venv/bin/python3 -m boxyd.daemon.main" 2>/dev/null || true
# And no test internet of this suite's (its prefix names its pytest) if a crash left one up.
if ip netns list 2>/dev/null | grep -q "^boxyt$pytest_pid-host"; then
  "$stage/.venv/bin/python3" -m tests.harness.topology down --prefix "boxyt$pytest_pid" >/dev/null 2>&1 || true
fi
exit $rc
