#!/usr/bin/env bash
# boxyctl and boxy on PATH (`make setup`): links to the venv's scripts in /usr/local/bin
# as root, in ~/.local/bin otherwise (said when that directory is not on PATH).
#   packaging/link-commands.sh VENV_BIN
set -euo pipefail
bin=$1
if [ "$(id -u)" = 0 ]; then
  dest=/usr/local/bin
else
  dest=${XDG_BIN_HOME:-$HOME/.local/bin}
fi
install -d "$dest"
for name in boxyctl boxy; do
  [ -x "$bin/$name" ] || { echo "make setup: $bin/$name is missing (make venv writes it)" >&2; exit 1; }
  ln -sfn "$bin/$name" "$dest/$name"
done
echo "boxy: boxyctl and boxy linked in $dest"
case ":$PATH:" in
  *":$dest:"*) ;;
  *) echo "make setup: $dest is not on your PATH; add it to run boxyctl by name" >&2 ;;
esac
