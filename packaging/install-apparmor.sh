#!/bin/bash
# Install and load boxy's AppArmor profile for the interpreter that runs stage 2.
#
#   packaging/install-apparmor.sh VENV_PYTHON [--shared-interpreter]
#
# Only acts where AppArmor is active and restricts unprivileged user namespaces
# (kernel.apparmor_restrict_unprivileged_userns exists, Ubuntu >= 23.10);
# elsewhere it prints one line and exits 0. Safe to run again: the file is
# rewritten only when it changes, and reloading a loaded profile is harmless.
set -euo pipefail

say() { printf 'boxy: %s\n' "$*"; }
die() { printf 'boxy: %s\n' "$1" >&2; exit "${2:-1}"; }

usage="usage: $0 VENV_PYTHON [--shared-interpreter]"
python=""
shared=0
for arg in "$@"; do
  case "$arg" in
    --shared-interpreter) shared=1 ;;
    -h|--help) say "$usage"; exit 0 ;;
    -*) die "unknown option $arg ($usage)" 2 ;;
    *) [[ -z "$python" ]] || die "one interpreter only ($usage)" 2; python="$arg" ;;
  esac
done
[[ -n "$python" ]] || die "$usage" 2

sysctl=/proc/sys/kernel/apparmor_restrict_unprivileged_userns
if [[ "$(cat /sys/module/apparmor/parameters/enabled 2>/dev/null)" != "Y" \
      || ! -d /sys/kernel/security/apparmor ]]; then
  say "AppArmor is not active here: no profile needed"; exit 0
fi
if [[ ! -e "$sysctl" ]]; then
  say "AppArmor does not restrict user namespaces on this kernel: no profile needed"; exit 0
fi

[[ -x "$python" && -f "$python" ]] || die "$python is not an executable file" 2
# AppArmor attaches a profile by the resolved path of what was exec'd.
real="$(readlink -f -- "$python")"
venv="$(cd -P -- "$(dirname -- "$python")/.." && pwd)"
if [[ "$real" != "$venv"/* && "$shared" -ne 1 ]]; then
  die "$python resolves to $real, outside $venv: a profile there would let every program \
run by that interpreter create user namespaces. Recreate the venv with \
'python3 -m venv --copies', or pass --shared-interpreter to accept that." 2
fi
# These would be globbing or quoting inside the profile's attachment.
case "$real" in
  *[\"\\*?\[\]{}^]*|*$'\n'*) die "cannot write an AppArmor attachment for the path $real" 2 ;;
esac

here="$(cd -P -- "$(dirname -- "$0")" && pwd)"
template="$here/apparmor/boxy"
target=/etc/apparmor.d/boxy
[[ -r "$template" ]] || die "missing $template"
[[ "$(id -u)" -eq 0 ]] || die "loading an AppArmor profile needs root: sudo $0 $python"
command -v apparmor_parser >/dev/null || die "apparmor_parser not found: install the apparmor package"

profile="$(<"$template")"
profile="${profile//@BOXY_PYTHON@/"$real"}"
tmp="$(mktemp "$target.XXXXXX")"
trap 'rm -f -- "$tmp"' EXIT
printf '%s\n' "$profile" >"$tmp"
chmod 0644 "$tmp"
if cmp -s -- "$tmp" "$target"; then
  rm -f -- "$tmp"
else
  mv -f -- "$tmp" "$target"
fi
apparmor_parser -r -- "$target"
say "AppArmor profile boxy loaded for $real"
