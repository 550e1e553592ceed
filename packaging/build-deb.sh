#!/usr/bin/env bash
# `make deb`: boxy_VERSION_ARCH.deb at the top of the tree, built by dpkg-buildpackage
# from a copy of the tree as it is (uncommitted edits included, as tests/harness/stage.sh
# copies it): dpkg-buildpackage writes its results beside the source directory and
# debhelper its work under debian/, neither of which belongs in a checkout.
#   packaging/build-deb.sh
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
version=$(dpkg-parsechangelog -l "$src/debian/changelog" -S Version)
ident=$(sed -n 's/^VERSION = "\(.*\)"$/\1/p' "$src/boxy/ident.py")
[[ "$version" == "$ident" ]] || {
  echo "make deb: debian/changelog says $version, boxy/ident.py $ident: add a changelog entry" >&2
  exit 1
}
work="$src/build/deb"
rm -rf "$work"
mkdir -p "$work/boxy-$version"
tar -C "$src" --exclude=./.venv --exclude=./.git --exclude=./build --exclude='*.egg-info' \
  --exclude='*/__pycache__' --exclude='./.*_cache' --exclude='./boxy_*.deb' -cf - . |
  tar -C "$work/boxy-$version" -xf -
start=$SECONDS
(cd "$work/boxy-$version" && dpkg-buildpackage -b -us -uc >"$work/build.log" 2>&1) || {
  tail -n 30 "$work/build.log" >&2
  echo "make deb: dpkg-buildpackage failed (the whole log: $work/build.log)" >&2
  exit 1
}
deb=$(cd "$work" && ls boxy_"$version"_*.deb)
rm -f "$src"/boxy_*.deb
mv "$work/$deb" "$src/$deb"
echo "make deb: $deb ($(du -k "$src/$deb" | cut -f1) KiB, built in $((SECONDS - start)) s);" \
  "install it with: apt-get install ./$deb"
