# roomcast: build, test, run and install roomcastd (GNU make).
#
#   make              release build (.build/release/roomcastd)
#   make run          install missing Debian deps, build, run in the foreground on 127.0.0.1:9898
#   make test         install missing Debian deps, build, run every test, check the unit files
#   make bench        benchmark roomcastd against Redis pub/sub (BENCHMARKS.md); bench-plot, bench-profile
#   make install      static release build, installed under $(DESTDIR)$(PREFIX)
#
# Paths: the binary goes to $(BINDIR), the units to $(UNITDIR) (PREFIX/lib/systemd/system:
# /usr/local/lib/systemd/system is on systemd's unit search path, and /etc/systemd/system
# stays free for the operator's overrides), the config to $(SYSCONFDIR)/roomcast.
# DESTDIR is prepended to all of them, for staging and packaging.

PREFIX     ?= /usr/local
DESTDIR    ?=
BINDIR     ?= $(PREFIX)/bin
SYSCONFDIR ?= /etc
UNITDIR    ?= $(PREFIX)/lib/systemd/system

SWIFT      ?= swift
# Debian packages the build and the tests need: libsystemd-dev + pkg-config for the
# CSystemd target, systemd for systemd-socket-activate and systemd-analyze, python3
# (with PyPI protobuf) for the proto2 compatibility tests.
DEB_PACKAGES := libsystemd-dev pkg-config systemd python3

SHELL       := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
SUDO        := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all build deps run test check-units check-config static install uninstall clean

all: build

build:
	$(SWIFT) build -c release

# Installs only what is missing; a second run does nothing.
deps:
	@if ! pkg-config --exists libsystemd 2>/dev/null \
	    || ! command -v systemd-socket-activate >/dev/null \
	    || ! command -v systemd-analyze >/dev/null \
	    || ! command -v python3 >/dev/null; then \
	    echo "deps: installing $(DEB_PACKAGES)"; \
	    $(SUDO) apt-get update -q; \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(DEB_PACKAGES); \
	fi
	@if ! python3 -c 'import google.protobuf' 2>/dev/null; then \
	    echo "deps: installing PyPI protobuf"; \
	    if ! python3 -m pip --version >/dev/null 2>&1; then \
	        $(SUDO) apt-get update -q; \
	        $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-pip; \
	    fi; \
	    $(SUDO) python3 -m pip install --quiet protobuf \
	        || $(SUDO) python3 -m pip install --quiet --break-system-packages protobuf; \
	fi

# The build runs in the recipe, not as a prerequisite, so that `make -j` cannot start
# it before deps are in place.
run: deps
	$(SWIFT) build -c release
	exec .build/release/roomcastd --config config/roomcastd.conf --listen 127.0.0.1:9898

test: deps
	$(SWIFT) build -c release
	$(SWIFT) build --build-tests
	$(SWIFT) test
	systemd/check-units.sh

check-units:
	systemd/check-units.sh

check-config: build
	.build/release/roomcastd --check-config --config config/roomcastd.conf

# The installed binary carries the Swift runtime, so the unit needs nothing from the
# toolchain. Its own build path keeps it from relinking the dynamic .build/release one.
static:
	$(SWIFT) build -c release --static-swift-stdlib --build-path .build-static

install: static
	install -d "$(DESTDIR)$(BINDIR)" "$(DESTDIR)$(UNITDIR)" "$(DESTDIR)$(SYSCONFDIR)/roomcast"
	install -m 0755 .build-static/release/roomcastd "$(DESTDIR)$(BINDIR)/roomcastd"
	systemd/render "$(BINDIR)" "$(SYSCONFDIR)" "$(DESTDIR)$(UNITDIR)"
	@# Never overwrite an operator's config. 0644: the service's dynamic user must read it.
	@if [ -e "$(DESTDIR)$(SYSCONFDIR)/roomcast/roomcastd.conf" ]; then \
	    echo "install: keeping existing $(DESTDIR)$(SYSCONFDIR)/roomcast/roomcastd.conf"; \
	else \
	    install -m 0644 config/roomcastd.conf "$(DESTDIR)$(SYSCONFDIR)/roomcast/roomcastd.conf"; \
	fi
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

# Leaves the config in place: it may hold the operator's edits.
uninstall:
	rm -f "$(DESTDIR)$(BINDIR)/roomcastd" \
	      "$(DESTDIR)$(UNITDIR)/roomcastd.service" \
	      "$(DESTDIR)$(UNITDIR)/roomcastd.socket"
	@echo "uninstall: left $(DESTDIR)$(SYSCONFDIR)/roomcast/roomcastd.conf in place"

clean:
	rm -rf .build .build-static .build-bench

# Benchmarks (BENCHMARKS.md). Their own build path, so they never relink the
# .build/release binaries of `make` or a test run that is going on.
BENCH_BUILD ?= $(CURDIR)/.build-bench
export BENCH_BUILD

.PHONY: bench bench-plot bench-profile

# Every workload of issue 5 against roomcastd and Redis (installed if missing):
# one table with both servers and the ratios (about 3 minutes plus the build).
bench:
	bench/run.sh

# The scaling curve: bench/scaling.png (gnuplot-nox installed if missing).
bench-plot:
	bench/plot.sh

# Instructions per delivered frame under callgrind, top functions, syscalls.
bench-profile:
	bench/profile.sh
