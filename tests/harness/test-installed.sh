#!/usr/bin/env bash
# As root (CI, after `make deb`): install the package on this machine, run the escape
# suite against the installed copy as the unprivileged test user, then purge it
# whatever happened and check that nothing it installed or made is left behind.
#   tests/harness/test-installed.sh BOXY_DEB [PYTEST_ARGS...]   (default: tests/escape)
# BOXY_TEST_USER and BOXY_TEST_STAGE are run-tests.sh's.
set -euo pipefail
deb=$(realpath -- "$1")
shift
(($#)) || set -- tests/escape
src=$(cd "$(dirname "$0")/../.." && pwd)
say() { printf 'test-installed: %s\n' "$*" >&2; }
[ "$(id -u)" = 0 ] || { say "installs a package: run as root"; exit 2; }
[ -f "$deb" ] || { say "no package $deb (make deb builds it)"; exit 2; }
if dpkg-query -W -f='${db:Status-Status}' boxy 2>/dev/null | grep -qv '^not-installed$'; then
  say "boxy is installed already: this would purge it; remove it first"
  exit 2
fi

marker=$(mktemp)
files=$(mktemp)
# what the package and its maintainer scripts may touch, checked after the purge
watched=(/usr/lib/boxy /usr/bin/boxyctl /usr/bin/boxy /usr/lib/systemd/user /etc/systemd/user
  /usr/share/dbus-1/services /etc/apparmor.d /var/cache/apparmor /usr/share/boxy
  /usr/share/man/man1 /usr/share/bash-completion/completions /usr/share/zsh/vendor-completions
  /usr/share/fish/vendor_completions.d /usr/share/doc/boxy)

purge() {
  local rc=$? left
  trap - EXIT
  DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq boxy >/dev/null 2>&1 ||
    { say "apt-get purge boxy failed"; rc=1; }
  if dpkg-query -W -f='${db:Status-Status}' boxy 2>/dev/null | grep -qv '^not-installed$'; then
    say "after the purge dpkg still knows boxy: $(dpkg-query -W -f='${db:Status-Status}' boxy)"
    rc=1
  fi
  # every path the package shipped, and anything made since it was installed
  # (a directory another package owns stays, as it should)
  left=$( (while read -r path; do
    [ "$path" != /. ] || continue
    [ -e "$path" ] || [ -L "$path" ] || continue
    if [ -d "$path" ] && ! [ -L "$path" ] && dpkg -S "$path" >/dev/null 2>&1; then continue; fi
    echo "$path"
  done <"$files"
    find "${watched[@]}" -newer "$marker" ! -type d 2>/dev/null || true
    if [ -e /usr/lib/boxy ]; then echo /usr/lib/boxy; fi) | sort -u)
  if [ -n "$left" ]; then
    say "left behind after the purge:"$'\n'"$left"
    rc=1
  else
    say "purged: nothing left behind"
  fi
  rm -f "$marker" "$files"
  exit "$rc"
}
trap purge EXIT

sleep 1 # -newer compares whole seconds on some filesystems
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$deb" >/dev/null
dpkg -L boxy >"$files"
say "installed $(dpkg-query -W -f='${Package} ${Version}' boxy): $(wc -l <"$files") paths"

# Nothing installed may name the directory it was built in (or this checkout).
built=$(grep -rlI -e "$src/build" -e "$src/" /usr/lib/boxy /usr/lib/systemd/user/boxyd.* \
  /usr/share/dbus-1/services/dev.boxy.Daemon.service /usr/share/boxy 2>/dev/null || true)
[ -z "$built" ] || { say "installed files name the build tree: $built"; exit 1; }

BOXY_TEST_BIN=/usr/lib/boxy/bin "$src/tests/harness/run-tests.sh" "$src/.venv" "$@"
