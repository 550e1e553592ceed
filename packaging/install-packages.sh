#!/usr/bin/env bash
# Install the Debian packages boxy and its test suite need, then prove they work.
#
#   packaging/install-packages.sh PACKAGE...      (make packages passes $(DEB_PACKAGES))
#   packaging/install-packages.sh --no-probe PACKAGE...   (make deb: its build tools only)
#
# - A package is wanted only when dpkg does not have it installed and, for the
#   tools listed in `provided_by` below, when that tool does not already work:
#   NodeSource's nodejs bundles npm and conflicts with Debian's npm package, so
#   asking apt for both refuses the whole list ("held broken packages").
# - As root the wanted packages are installed in one apt-get call; any failure
#   stops here with one line naming what is still missing. As a normal user the
#   one `sudo apt-get install ...` line is printed and the exit status says
#   whether anything is missing.
# - Then every part the suite uses is probed by running it (not by dpkg -s), and
#   a part that does not work fails the setup by name.
set -uo pipefail

# --no-probe: install only; the probes below are of what the suite uses, not a build's
probes=1
if [[ "${1:-}" == --no-probe ]]; then probes=0; shift; fi
who=${BOXY_MAKE_TARGET:-make setup}
say() { printf '%s: %s\n' "$who" "$*" >&2; }

# A package that a working tool on PATH already provides (however it was installed).
declare -A provided_by=([nodejs]="node --version" [npm]="npm --version")

installed() { [[ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" == installed ]]; }
wanted() {
  installed "$1" && return 1
  local probe=${provided_by[$1]:-}
  [[ -n "$probe" ]] && $probe >/dev/null 2>&1 && return 1
  return 0
}
missing_of() { local p; for p in "$@"; do wanted "$p" && printf '%s ' "$p"; done; }

(($# > 0)) || { say "no packages given (DEB_PACKAGES is empty)"; exit 2; }
missing=$(missing_of "$@")
missing=${missing% }

if [[ -n "$missing" ]]; then
  if [[ "$(id -u)" != 0 ]]; then
    say "missing Debian packages; run: sudo apt-get install $missing"
    exit 1
  fi
  log=$(mktemp); trap 'rm -f "$log"' EXIT
  # shellcheck disable=SC2086 # one word per package
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing; } \
      >"$log" 2>&1; then
    still=$(missing_of $missing); still=${still% }
    reason=$(grep -E '^E: ' "$log" | head -1)
    say "apt-get could not install: ${still:-$missing}(${reason:-see the output of apt-get}); try: apt-get install ${still:-$missing}"
    exit 1
  fi
  still=$(missing_of $missing)
  [[ -z "$still" ]] || { say "apt-get reported success but these are not installed: $still"; exit 1; }
fi

((probes)) || exit 0

# Each part by what the suite does with it. Debian's python3 is the one the venv is built
# from (--system-site-packages), so the bindings must import there.
declare -a failed=()
probe() { local what=$1; shift; "$@" >/dev/null 2>&1 || failed+=("$what"); }
probe "nft (nftables)" nft --version
probe "libnftables binding (python3-nftables)" /usr/bin/python3 -c 'import nftables; nftables.Nftables()'
probe "bwrap (bubblewrap)" bwrap --version
probe "systemd binding (python3-systemd)" /usr/bin/python3 -c 'import systemd.daemon, systemd.journal'
probe "dbus-run-session (dbus-user-session)" dbus-run-session -- true
probe "dbus-python (python3-dbus)" /usr/bin/python3 -c 'import dbus'
probe "bash-completion" test -r /usr/share/bash-completion/bash_completion
probe "node" node --version
probe "npm" npm --version
probe "git" git --version
probe "man (man-db)" man --version
probe "ssh-keygen (openssh-client)" sh -c 'd=$(mktemp -d) && ssh-keygen -q -t ed25519 -N "" -f "$d/k" && rm -rf "$d"'
probe "openssl" openssl version
probe "gpg (gnupg)" gpg --version
if ((${#failed[@]})); then
  say "installed, but these do not work: $(IFS=';'; echo "${failed[*]}" | sed 's/;/, /g')"
  exit 1
fi
