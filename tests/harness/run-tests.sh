#!/usr/bin/env bash
# Run the whole suite. As root (CI): sandboxes are exercised as an unprivileged test
# user, so the tree is staged where that user can read it (a clean clone may sit
# under /root, mode 0700) and pytest, still root for the harness's own setup steps,
# runs every `boxyctl` as that user. As a normal user: everything runs as you.
# BOXY_TEST_BIN=DIR tests the boxy installed there (/usr/lib/boxy/bin: the Debian
# package) instead of the staged tree's: pytest and the harness still run from the stage.
set -euo pipefail
venv=${1:-.venv}
shift || true
# the rest: pytest's own arguments (default: the whole suite)
(($#)) || set -- tests
src=$(cd "$(dirname "$0")/../.." && pwd)
if [ -n "${BOXY_TEST_BIN:-}" ]; then
  [ -x "$BOXY_TEST_BIN/boxyctl" ] || { echo "run-tests: no boxyctl in BOXY_TEST_BIN=$BOXY_TEST_BIN" >&2; exit 2; }
  export BOXY_TEST_BIN
  echo "run-tests: testing the boxy in $BOXY_TEST_BIN ($("$BOXY_TEST_BIN/boxyctl" --version))" >&2
fi

if [ "$(id -u)" != 0 ]; then
  cd "$src"
  exec "$venv/bin/python3" -m pytest -q -p no:cacheprovider "$@"
fi

# The pinned Claude Code the agent-harness tests run on the host (its npm package into a
# root-owned cache, once: the only registry contact outside the real-install tests).
/usr/bin/python3 "$src/tests/harness/claudecode.py" install >/dev/null

# The whole suite as two shards at once, each with a test user, a stage, a boxyd and
# a test internet of its own (nothing of one is the other's), so it keeps under 10
# minutes on two cores: the escape suite beside the unit and integration suites.
# BOXY_TEST_SERIAL=1: one after the other, as before. Never for an installed boxy
# (BOXY_TEST_BIN: its run is the escape suite alone).
if [ "$*" = tests ] && [ -z "${BOXY_TEST_BIN:-}" ] && [ -z "${BOXY_TEST_SERIAL:-}" ]; then
  log=$(mktemp)
  BOXY_TEST_USER=${BOXY_TEST_USER2:-boxytest2} BOXY_TEST_STAGE=${BOXY_TEST_STAGE2:-/opt/boxy-test2} \
    "$0" "$venv" tests/escape >"$log" 2>&1 &
  escape=$!
  set +e
  "$0" "$venv" tests/unit tests/integration
  rc=$?
  wait "$escape"
  rc_escape=$?
  set -e
  echo "run-tests: the escape suite, run beside the rest (as ${BOXY_TEST_USER2:-boxytest2}):"
  cat "$log"
  rm -f "$log"
  [ "$rc" = 0 ] || exit "$rc"
  exit "$rc_escape"
fi

user=${BOXY_TEST_USER:-boxytest}
# another stage (BOXY_TEST_STAGE) lets a second suite run beside this one
stage=${BOXY_TEST_STAGE:-/opt/boxy-test}
"$src/tests/harness/stage.sh" "$user" "$stage"

# The test user's quarantine is what earlier suites left (its entries count against
# the quarantine's budget: quarantine.TOTAL_ENTRIES), and so are the notices no hook
# took (64 wait at most: boxy/notices.py): each suite starts with none.
home=$(getent passwd "$user" | cut -d: -f6)
rm -rf "$home/.local/state/boxy/quarantine" "$home/.local/state/boxy/notices"
cd "$stage"
export BOXY_TEST_USER="$user"
set +e
# the slowest tests listed at the end: the suite is held under 10 minutes (README)
"$stage/.venv/bin/python3" -m pytest -q -rs -p no:cacheprovider --durations=15 "$@" &
pytest_pid=$!
wait "$pytest_pid"
rc=$?
set -e
# Leave no daemon of this suite behind (only this venv's: other suites may be running).
pkill -u "$user" -f "^$stage/.venv/bin/python3 -m boxyd( |$)" 2>/dev/null || true
if [ -n "${BOXY_TEST_BIN:-}" ]; then
  pkill -u "$user" -f "^$BOXY_TEST_BIN/python3 -m boxyd( |$)" 2>/dev/null || true
fi
# And no test internet of this suite's (its prefix names its pytest) if a crash left one up.
if ip netns list 2>/dev/null | grep -q "^boxyt$pytest_pid-host"; then
  "$stage/.venv/bin/python3" -m tests.harness.topology down --prefix "boxyt$pytest_pid" >/dev/null 2>&1 || true
fi
exit $rc
