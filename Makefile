# boxy — `make setup` installs what it needs; `make test` runs the whole suite.
PYTHON  ?= /usr/bin/python3
VENV    ?= .venv
DEB_PACKAGES = python3 python3-venv python3-dev gcc pkg-config libsystemd-dev libseccomp2 \
               nftables libnftables1 python3-nftables python3-systemd git bubblewrap util-linux \
               iproute2 dbus-user-session man-db nodejs npm python3-cryptography \
               openssh-client openssl gnupg python3-dbus bash-completion

# what `make deb` builds with (debian/control's Build-Depends, and dpkg-buildpackage)
DEB_BUILD_PACKAGES = debhelper dpkg-dev python3-venv

.PHONY: setup packages venv docs test lint demo bench clean deb

setup: packages venv docs
	@if [ "$$(id -u)" = 0 ]; then packaging/install-apparmor.sh "$(abspath $(VENV))/bin/python3"; fi
	@packaging/link-commands.sh "$(abspath $(VENV))/bin"
	@# boxyd's systemd user units, for the user running make (socket enabled when a
	@# user manager runs; without one boxyctl starts boxyd on demand)
	$(VENV)/bin/boxyctl setup

# Installs what is missing (as root) or prints the sudo line (as a user), then
# probes every part; any failure stops here, naming it.
packages:
	@packaging/install-packages.sh $(DEB_PACKAGES)

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@[ -x $(VENV)/bin/python3 ] || $(PYTHON) -m venv --copies --system-site-packages $(VENV)
	$(VENV)/bin/pip install -q -e '.[test]' --config-settings editable_mode=compat
	@# --secret's session CA: say so now rather than at the first run that needs it
	@$(VENV)/bin/python3 -c 'from cryptography import x509; from cryptography.hazmat.primitives.asymmetric import ec' \
	  || { echo "boxy: the cryptography package does not import in $(VENV) (pip install cryptography>=38)" >&2; exit 1; }
	@# boxyctl, boxy and boxy-sh start without site (boxyctl/launcher.py says why)
	$(VENV)/bin/python3 -I -m boxyctl.launcher $(VENV)/bin
	@# Byte-compile now: other users (and stage 2) cannot write __pycache__ here.
	$(VENV)/bin/python3 -m compileall -q boxy boxyd boxyctl >/dev/null
	@touch $@

# boxyctl(1) and the bash/zsh/fish completions, generated from the parser: for every
# user under /usr/local/share as root, under $XDG_DATA_HOME (~/.local/share) otherwise
docs: venv
	@if [ "$$(id -u)" = 0 ]; then share=/usr/local/share; else share=$${XDG_DATA_HOME:-$$HOME/.local/share}; fi; \
	set -e; \
	install -d "$$share/man/man1" "$$share/bash-completion/completions" "$$share/zsh/site-functions" \
	  "$$share/fish/vendor_completions.d"; \
	$(VENV)/bin/python -m boxyctl.completion man > "$$share/man/man1/boxyctl.1"; \
	$(VENV)/bin/python -m boxyctl.completion bash > "$$share/bash-completion/completions/boxyctl"; \
	ln -sf boxyctl "$$share/bash-completion/completions/boxy"; \
	$(VENV)/bin/python -m boxyctl.completion zsh > "$$share/zsh/site-functions/_boxyctl"; \
	$(VENV)/bin/python -m boxyctl.completion fish > "$$share/fish/vendor_completions.d/boxyctl.fish"; \
	echo "boxy: boxyctl(1) and shell completions installed under $$share"

test: venv docs
	tests/harness/run-tests.sh $(VENV)

# The gates CI runs before the tests (docs/design.md, "Code"); mypy's settings are
# in pyproject.toml (strict, over boxy, boxyd, boxyctl and the tests).
lint: venv
	$(VENV)/bin/ruff check boxy boxyd boxyctl tests bench
	$(VENV)/bin/ruff format --check boxy boxyd boxyctl tests bench
	$(VENV)/bin/mypy

demo: setup
	$(VENV)/bin/boxyctl run --net none -- sh -c 'echo "hello from $$(hostname): $$(id)"; ls -A $$HOME; cat ~/.ssh/id_* 2>&1 | head -1'

# Every figure of issue #18 in one table; BEFORE=REV also measures the tree at REV in
# the same run. As root for the whole table (bench/all.py says what runs as whom).
bench: venv
	$(VENV)/bin/python bench/all.py $(if $(BEFORE),--before $(BEFORE))

# boxy_VERSION_ARCH.deb here: boxy in /usr/lib/boxy, for `apt-get install ./boxy_*.deb`
# (debian/rules says how; packaging/build-deb.sh builds it from a copy of this tree)
deb:
	@BOXY_MAKE_TARGET="make deb" packaging/install-packages.sh --no-probe $(DEB_BUILD_PACKAGES)
	@packaging/build-deb.sh

clean:
	rm -rf $(VENV) build *.egg-info boxy_*.deb
