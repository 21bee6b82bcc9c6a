# roomcast: build, test, run and install roomcastd (GNU make).
#
#   make              release build (.build/release/roomcastd)
#   make run          install missing Debian deps, build, run in the foreground on 127.0.0.1:9898
#   make test         install missing Debian deps, build, run every test (the slow hostile
#                     suites included), check the unit files, the man pages and the docs
#   make check-docs   every relative link and anchor of README.md, BENCHMARKS.md and docs/**/*.md
#                     resolves (docs/check-links.py), README.md stays at most 250 lines, the other pages 400
#   make test-asan    the same tests, tests and roomcastd built with AddressSanitizer
#   make soak         chaos soak: ~2,000 loopback clients for SOAK_SECONDS (default 60)
#   make bench        benchmark roomcastd against a minimal C relay and Redis pub/sub (BENCHMARKS.md);
#                     bench-relay, bench-plot, bench-profile, bench-tls, bench-publish, bench-history
#   make install      static release build, installed under $(DESTDIR)$(PREFIX)
#   make deb          the Debian package roomcast_VERSION_ARCH.deb (packaging/deb/);
#                     lint-deb runs lintian on it
#   make test-systemd boots a real systemd 252 in systemd-nspawn, installs the .deb into it
#                     with apt and checks install, socket activation, status, journal, reload,
#                     watchdog, stop, restarts that keep every client, the units, apt remove
#                     and purge, and that make install lays out the same files
#                     (systemd/test-systemd.py); needs root
#   make bench-restart 10,000 chatting clients across a restart and a SIGKILL in the same
#                     container: the gap and PID 1's CPU (bench/restart.py); needs root
#   make fuzz         run each libFuzzer target for FUZZ_SECONDS (default 60)
#   make test-browser the chat page in headless Chromium (Debian's chromium, chromium-driver,
#                     python3-selenium; deps-browser installs them): two tabs and an LTB client
#   make test-autobahn Autobahn|Testsuite's fuzzing client against a release roomcastd's
#                     /echo (sections AUTOBAHN_CASES); every case OK, NON-STRICT or
#                     INFORMATIONAL (tools/autobahn/run.py; needs pyenv's Python 2.7.18)
#
# Paths: the binaries (roomcastd, and the roomcast client) go to $(BINDIR), the man pages to $(MANDIR),
# the units to $(UNITDIR) (PREFIX/lib/systemd/system:
# /usr/local/lib/systemd/system is on systemd's unit search path, and /etc/systemd/system
# stays free for the operator's overrides), the config to $(SYSCONFDIR)/roomcast.
# DESTDIR is prepended to all of them, for staging and packaging.

PREFIX     ?= /usr/local
DESTDIR    ?=
BINDIR     ?= $(PREFIX)/bin
SYSCONFDIR ?= /etc
UNITDIR    ?= $(PREFIX)/lib/systemd/system
MANDIR     ?= $(PREFIX)/share/man
# The chat page's files (web/); roomcastd's default [websocket] page_dir is share/roomcast/web
# beside its bin/, so keep WEBDIR at $(PREFIX)/share/roomcast/web for BINDIR = $(PREFIX)/bin.
WEBDIR     ?= $(PREFIX)/share/roomcast/web
WEB_FILES  := index.html chat.css chat.js

SWIFT      ?= swift
# Debian packages the build and the tests need: libsystemd-dev + pkg-config for the
# CSystemd target, systemd for systemd-socket-activate and systemd-analyze, python3
# (with PyPI protobuf) for the proto2 compatibility tests (and PyPI websockets, an
# independent WebSocket client for the WebSocket tests), scdoc and mandoc for the man
# pages, iproute2 (ip) and util-linux (unshare) for the dead-peer tests' network namespace,
# libhiredis-dev for the CHiredis target ([cluster]) and redis-server (with
# redis-cli) for the cluster tests, which start their own on ephemeral loopback ports;
# libssl-dev for the COpenSSL target (libssl and libcrypto: the WebSocket handshake's
# SHA-1 and base64, HMAC-SHA256 and Ed25519 of signed joins, TLS), and PyPI
# pyjwt + cryptography, with which the signed-join tests mint their tokens; haproxy and
# openssl for the PROXY protocol test (HAProxy terminating TLS in front, a certificate
# made at test time).
DEB_PACKAGES := libsystemd-dev pkg-config systemd python3 scdoc mandoc iproute2 util-linux libhiredis-dev redis-server libssl-dev haproxy openssl
# PyPI packages of the tests, as MODULE=PACKAGE: protobuf (the proto2 reference), pyjwt and
# cryptography (tokens for the signed-join tests), websockets (an independent WebSocket client).
PIP_PACKAGES := google.protobuf=protobuf jwt=pyjwt cryptography=cryptography websockets=websockets
# Only for test-browser: headless Chromium, its WebDriver and Selenium, all from Debian (~380 MB).
DEB_PACKAGES_BROWSER := chromium chromium-driver python3-selenium
# Only for test-systemd: a Debian root to boot, and systemd-nspawn to boot it.
DEB_PACKAGES_SYSTEMD := systemd-container debootstrap
# The one version: Sources/RoomcastCore/Version.swift (packaging/deb/changelog
# must start with it). The package is named as dpkg-name(1) would name it.
VERSION  := $(shell sed -n 's/^public let roomcastVersion = "\(.*\)"$$/\1/p' Sources/RoomcastCore/Version.swift)
DEB_ARCH  = $(shell dpkg --print-architecture)
DEB       = roomcast_$(VERSION)_$(DEB_ARCH).deb
DEB_BUILD := .build/deb

# The man pages: scdoc sources in man/, troff built into .build/man.
MAN_PAGES := roomcastd.8 roomcastd.conf.5 roomcast.1
MAN_OUT   := $(addprefix .build/man/,$(MAN_PAGES))
# test-systemd: the cached Debian root (made once) and the install staged for the container.
SYSTEMD_ROOT  := .build/systemd-root
SYSTEMD_STAGE := .build/systemd-stage

SHELL       := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
SUDO        := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# libFuzzer targets (Tests/Fuzz/<target>/, seeds in Tests/Fuzz/corpus/<target>/).
# promtool, unpacked by make deps (the metrics test runs it).
PROMTOOL_DIR := $(CURDIR)/.build-deps/prometheus
PROMTOOL     := $(PROMTOOL_DIR)/root/usr/bin/promtool

FUZZ_TARGETS := FuzzFrameDecoder FuzzProto2 FuzzConfig FuzzWebSocket FuzzToken FuzzProxyHeader FuzzHTTP FuzzModerationWire FuzzClusterWire
FUZZ_SECONDS ?= 60
FUZZ_BUILD   ?= .build-fuzz

ASAN_BUILD   ?= .build-asan
SOAK_SECONDS ?= 60
SOAK_CLIENTS ?= 2000

.PHONY: test-autobahn deps-browser test-browser
.PHONY: all build deps deps-systemd deps-deb deb lint-deb run test test-asan test-systemd stage-systemd bench-restart soak fuzz check-units check-man check-docs check-config man static install uninstall clean

all: build

build:
	$(SWIFT) build -c release

# Installs only what is missing; a second run does nothing.
deps:
	@if ! pkg-config --exists libsystemd 2>/dev/null \
	    || ! pkg-config --exists hiredis 2>/dev/null \
	    || ! pkg-config --exists openssl 2>/dev/null \
	    || ! command -v redis-server >/dev/null \
	    || ! command -v redis-cli >/dev/null \
	    || ! command -v systemd-socket-activate >/dev/null \
	    || ! command -v systemd-analyze >/dev/null \
	    || ! command -v python3 >/dev/null \
	    || ! command -v scdoc >/dev/null \
	    || ! command -v mandoc >/dev/null \
	    || ! command -v ip >/dev/null \
	    || ! command -v unshare >/dev/null \
	    || ! command -v haproxy >/dev/null \
	    || ! command -v openssl >/dev/null; then \
	    echo "deps: installing $(DEB_PACKAGES)"; \
	    $(SUDO) apt-get update -q; \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(DEB_PACKAGES); \
	fi
	@missing=""; for p in $(PIP_PACKAGES); do python3 -c "import $${p%%=*}" 2>/dev/null || missing="$$missing $${p#*=}"; done; \
	if [ -n "$$missing" ]; then \
	    echo "deps: installing PyPI$$missing"; \
	    if ! python3 -m pip --version >/dev/null 2>&1; then \
	        $(SUDO) apt-get update -q; \
	        $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-pip; \
	    fi; \
	    $(SUDO) python3 -m pip install --quiet $$missing \
	        || $(SUDO) python3 -m pip install --quiet --break-system-packages $$missing; \
	fi
	@# promtool (Debian's prometheus package) checks GET /metrics in make test; only
	@# the binary is needed, so the .deb is unpacked here rather than installed (no service).
	@if [ ! -x $(PROMTOOL) ]; then \
	    echo "deps: unpacking promtool from Debian's prometheus package into $(PROMTOOL_DIR)"; \
	    rm -rf $(PROMTOOL_DIR) && mkdir -p $(PROMTOOL_DIR) && cd $(PROMTOOL_DIR) \
	    && { apt-get download prometheus >/dev/null 2>&1 || { $(SUDO) apt-get update -q && apt-get download prometheus; }; } \
	    && dpkg-deb -x prometheus_*.deb root && rm -f prometheus_*.deb; \
	fi

deps-systemd: deps
	@if ! command -v systemd-nspawn >/dev/null || ! command -v debootstrap >/dev/null; then \
	    echo "deps-systemd: installing $(DEB_PACKAGES_SYSTEMD)"; \
	    $(SUDO) apt-get update -q; \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(DEB_PACKAGES_SYSTEMD); \
	fi

# make deb needs dpkg-shlibdeps and dpkg-gencontrol (dpkg-dev); make lint-deb installs lintian.
deps-deb:
	@if ! command -v dpkg-shlibdeps >/dev/null || ! command -v dpkg-gencontrol >/dev/null; then \
	    echo "deps-deb: installing dpkg-dev"; \
	    $(SUDO) apt-get update -q; \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q dpkg-dev; \
	fi

# The build runs in the recipe, not as a prerequisite, so that `make -j` cannot start
# it before deps are in place.
# The shipped config (its values are the defaults) with the WebSocket listener on, serving
# the chat page from the repository's web/ (http://127.0.0.1:9897/).
run: deps
	@# Only the daemon and the client: the fuzzers, the bench and the soak driver are make test's.
	$(SWIFT) build -c release --product roomcastd
	$(SWIFT) build -c release --product roomcast
	@# The API (docs/api.md) on 127.0.0.1:9899 with a key made once for this checkout.
	@[ -s .build/run-api.keys ] || { umask 077; head -c 24 /dev/urandom | base64 | tr '+/' '-_' > .build/run-api.keys; }
	@echo "API: curl -H \"Authorization: Bearer \$$(cat .build/run-api.keys)\" http://127.0.0.1:9899/v1/stats"
	{ cat config/roomcastd.conf; printf '\n[websocket]\nlisten = 127.0.0.1:9897\npage = yes\npage_dir = %s\n\n[api]\nlisten = 127.0.0.1:9899\nkey_file = %s\n\n[rooms]\nhistory = 50\n' "$(CURDIR)/web" "$(CURDIR)/.build/run-api.keys"; } > .build/run.conf
	exec .build/release/roomcastd --config .build/run.conf --listen 127.0.0.1:9898

# The unit-file, man-page and docs checks come first, so that the output closes on
# the test runner's summary.
test: deps
	systemd/check-units.sh
	$(MAKE) --no-print-directory check-man
	$(MAKE) --no-print-directory check-docs
	$(SWIFT) build -c release
	$(SWIFT) build --build-tests
	ROOMCAST_SLOW_TESTS=1 $(SWIFT) test

# LeakSanitizer is told to ignore only what leaks inside XCTest and Foundation
# (libFoundation and libFoundationEssentials: String(contentsOf:) in the tests)
# (XCTest and Foundation leak on purpose at exit). AddressSanitizer is told to ignore one read
# of Foundation's own: Process.run lists /proc/self/fd and copies each dirent's d_name as a
# fixed 256 bytes, which reads past opendir's buffer when the last entry ends near its end
# (seen in a test that spawns roomcastd while many descriptors are open; not our code). The roomcastd the integration tests spawn is the
# ASan build too; a report on its stderr fails the test that ran it.
test-asan: deps
	@mkdir -p $(ASAN_BUILD)
	@printf 'leak:libXCTest.so\nleak:libFoundation.so\nleak:libFoundationEssentials.so\n' > $(ASAN_BUILD)/lsan.supp
	@printf 'interceptor_via_fun:*findMaximumOpenFromProcSelfFD*\n' > $(ASAN_BUILD)/asan.supp
	$(SWIFT) build --build-tests --sanitize=address --build-path $(ASAN_BUILD) 2>&1 | grep -v 'Cannot export local symbol'
	LSAN_OPTIONS=suppressions=$(abspath $(ASAN_BUILD))/lsan.supp ASAN_OPTIONS=suppressions=$(abspath $(ASAN_BUILD))/asan.supp \
	    ROOMCAST_SANITIZER=address ROOMCAST_SLOW_TESTS=1 \
	    $(SWIFT) test --skip-build --sanitize=address --build-path $(ASAN_BUILD)

# Release builds of roomcastd and the soak driver, which starts the roomcastd beside it.
soak:
	$(SWIFT) build -c release --product roomcastd
	$(SWIFT) build -c release --product roomcast-soak
	.build/release/roomcast-soak --seconds $(SOAK_SECONDS) --clients $(SOAK_CLIENTS)

check-units:
	systemd/check-units.sh

deps-browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null \
	    || ! /usr/bin/python3 -c 'import selenium' 2>/dev/null; then \
	    echo "deps-browser: installing $(DEB_PACKAGES_BROWSER)"; \
	    $(SUDO) apt-get update -q; \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(DEB_PACKAGES_BROWSER); \
	fi

# The chat page (web/) in headless Chromium driven by Selenium (Debian's python3-selenium,
# hence /usr/bin/python3): two tabs and an LTB client converse under a fake PID 1 with an fd
# store (tools/browser/fake_systemd.py), then two restarts and a SIGKILL that keep them (the page
# shows no reconnect; messages sent before, during and after each arrive once, in order), then a stop
# the page reconnects from; the DOM, the LTB frames and the tab's WebSocket frames are checked.
# Issue 23: with [rooms] history = 50, a third tab behind a cuttable loopback link (a phone's
# network) sees the recent lines on join, resumes after two resets without duplicates and
# shows a skipped notice.
# Screenshots: docs/images/browser-chat.png, docs/images/browser-restart.png (after the
# restarts). tools/browser/test_browser.py; about 25 s.
test-browser: deps-browser
	$(SWIFT) build -c release --product roomcastd
	/usr/bin/python3 tools/browser/test_browser.py --roomcastd .build/release/roomcastd --web web \
	    --screenshot docs/images/browser-chat.png --restart-screenshot docs/images/browser-restart.png --crash

# Autobahn|Testsuite 25.10.1 runs only on Python 2.7: pyenv's 2.7.18 (or AUTOBAHN_PYTHON), a
# loud failure without it. The pinned suite is installed once into AUTOBAHN_CACHE (pip
# --target, ~2 min); then the core sections, 1-7 and 10, and 9 (limits and speed, messages up
# to 16 MiB) take about 30 s. The summary goes to docs/autobahn-summary.md.
AUTOBAHN_CASES ?= 1,2,3,4,5,6,7,9,10
AUTOBAHN_CACHE ?= $(HOME)/.cache/roomcast/autobahn-25.10.1
test-autobahn:
	$(SWIFT) build -c release --product roomcastd
	python3 tools/autobahn/run.py --roomcastd .build/release/roomcastd --cases $(AUTOBAHN_CASES) \
	    --cache $(AUTOBAHN_CACHE) --summary docs/autobahn-summary.md

# Under a real systemd 252 (root, as CI runs): the Debian root is made once and cached;
# systemd/sandbox boots it, runs the suite and tears everything down. The suite installs
# the .deb with apt and compares the make install tree staged beside it; bench-restart
# runs the make install tree, which the container mounts at /usr/local and /etc/roomcast.
SANDBOX = systemd/sandbox $(SYSTEMD_ROOT) \
	    --bind=$(CURDIR)/$(SYSTEMD_STAGE)/usr/local:/usr/local \
	    --bind=$(CURDIR)/$(SYSTEMD_STAGE)/etc/roomcast:/etc/roomcast

stage-systemd: deps-systemd
	rm -rf $(SYSTEMD_STAGE)
	$(MAKE) --no-print-directory install DESTDIR=$(CURDIR)/$(SYSTEMD_STAGE) PREFIX=/usr/local SYSCONFDIR=/etc
	systemd/prepare-root $(SYSTEMD_ROOT)

test-systemd: stage-systemd
	$(MAKE) --no-print-directory deb
	systemd/sandbox $(SYSTEMD_ROOT) -- python3 systemd/test-systemd.py \
	    --deb $(CURDIR)/$(DEB) --install-stage $(CURDIR)/$(SYSTEMD_STAGE)

# Restarts that keep the clients: BENCH_RESTART_CLIENTS (default 10,000) chatting clients across a
# `systemctl restart` and a SIGKILL under the same real systemd 252 (root):
# the gap, PID 1's CPU, what the clients saw; the table goes to
# bench/results/restart-latest.md (bench/restart.py).
BENCH_RESTART_CLIENTS ?= 10000
bench-restart: stage-systemd
	@mkdir -p bench/results
	$(SANDBOX) -- python3 bench/restart.py --clients $(BENCH_RESTART_CLIENTS) --markdown bench/results/restart-latest.md

man: $(MAN_OUT)

.build/man/%: man/%.scd
	@mkdir -p .build/man
	scdoc < $< > $@.tmp
	mv $@.tmp $@

# Two linters, and any message fails: mandoc at warning level, except the redundant
# paragraph macros (.P after .SH, empty .P) that scdoc emits everywhere; and groff's
# warnings through man(1).
check-man: man
	@out=$$(mandoc -T lint -W warning $(MAN_OUT) 2>&1 \
	        | grep -Ev 'skipping paragraph macro: PP (after SH|empty)$$' || true); \
	for page in $(MAN_OUT); do \
	    out+=$$(MANWIDTH=80 man --warnings -E UTF-8 -l $$page 2>&1 >/dev/null); \
	done; \
	if [ -n "$$out" ]; then echo "$$out" >&2; exit 1; fi; \
	echo "check-man: mandoc -T lint and man --warnings: clean ($(MAN_PAGES))"

# The documentation: the checker's self-test first (planted broken links must fail), then
# every relative link and #anchor of the Markdown; README.md is the ten-minute read, the
# detail lives in docs/ and the man pages.
README_MAX_LINES := 250
DOCS_MAX_LINES := 400
check-docs:
	python3 docs/check-links.py --self-test >/dev/null
	python3 docs/check-links.py
	@lines=$$(wc -l < README.md); if [ "$$lines" -gt $(README_MAX_LINES) ]; then \
	    echo "check-docs: README.md has $$lines lines, more than $(README_MAX_LINES): move the detail to docs/" >&2; exit 1; fi; \
	echo "check-docs: README.md has $$lines lines (at most $(README_MAX_LINES))"
	@long=$$(find BENCHMARKS.md docs -name '*.md' -exec wc -l {} + | awk '$$2 != "total" && $$1 > $(DOCS_MAX_LINES)'); \
	if [ -n "$$long" ]; then echo "check-docs: over $(DOCS_MAX_LINES) lines, split by topic: $$long" >&2; exit 1; fi; \
	echo "check-docs: BENCHMARKS.md and every page under docs/ at most $(DOCS_MAX_LINES) lines"

# The installed binary carries the Swift runtime, so the unit needs nothing from the
# toolchain. Its own build path keeps it from relinking the dynamic .build/release one.
# -z now (with the linker's default RELRO): the GOT is read-only after start,
# as Debian's hardening flags make it (https://wiki.debian.org/Hardening).
static:
	$(SWIFT) build -c release --static-swift-stdlib --build-path .build-static -Xlinker -z -Xlinker now

install: static man
	install -d "$(DESTDIR)$(BINDIR)" "$(DESTDIR)$(UNITDIR)" "$(DESTDIR)$(SYSCONFDIR)/roomcast" \
	           "$(DESTDIR)$(MANDIR)/man8" "$(DESTDIR)$(MANDIR)/man5" "$(DESTDIR)$(MANDIR)/man1" \
	           "$(DESTDIR)$(WEBDIR)"
	install -m 0755 .build-static/release/roomcastd "$(DESTDIR)$(BINDIR)/roomcastd"
	install -m 0644 $(addprefix web/,$(WEB_FILES)) "$(DESTDIR)$(WEBDIR)/"
	install -m 0755 .build-static/release/roomcast "$(DESTDIR)$(BINDIR)/roomcast"
	install -m 0644 .build/man/roomcastd.8 "$(DESTDIR)$(MANDIR)/man8/roomcastd.8"
	install -m 0644 .build/man/roomcastd.conf.5 "$(DESTDIR)$(MANDIR)/man5/roomcastd.conf.5"
	install -m 0644 .build/man/roomcast.1 "$(DESTDIR)$(MANDIR)/man1/roomcast.1"
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
	rm -f "$(DESTDIR)$(BINDIR)/roomcastd" "$(DESTDIR)$(BINDIR)/roomcast" \
	      "$(DESTDIR)$(UNITDIR)/roomcastd.service" \
	      "$(DESTDIR)$(UNITDIR)/roomcastd-standalone.service" \
	      "$(DESTDIR)$(UNITDIR)/roomcastd.socket" \
	      "$(DESTDIR)$(UNITDIR)/roomcastd-json.socket" \
	      "$(DESTDIR)$(UNITDIR)/roomcastd-websocket.socket" \
	      "$(DESTDIR)$(MANDIR)/man8/roomcastd.8" \
	      "$(DESTDIR)$(MANDIR)/man5/roomcastd.conf.5" \
	      "$(DESTDIR)$(MANDIR)/man1/roomcast.1" \
	      $(addprefix "$(DESTDIR)$(WEBDIR)/,$(addsuffix ",$(WEB_FILES)))
	-rmdir "$(DESTDIR)$(WEBDIR)" "$(DESTDIR)$(dir $(WEBDIR))" 2>/dev/null
	@echo "uninstall: left $(DESTDIR)$(SYSCONFDIR)/roomcast/roomcastd.conf in place"

# The Debian package, built from `make install` into a staging tree with
# Debian's paths (units in /lib/systemd/system, as Debian 12's packages ship
# them), then packaged by packaging/deb/build with dpkg's own tools.
deb: deps-deb
	@[ -n "$(VERSION)" ] || { echo "deb: no roomcastVersion in Sources/RoomcastCore/Version.swift" >&2; exit 1; }
	rm -rf $(DEB_BUILD)
	$(MAKE) --no-print-directory install DESTDIR=$(CURDIR)/$(DEB_BUILD)/debian/roomcast \
	    PREFIX=/usr SYSCONFDIR=/etc UNITDIR=/lib/systemd/system MANDIR=/usr/share/man
	packaging/deb/build $(VERSION) $(DEB_BUILD) $(DEB)

# Debian's checks on the package: any error or warning fails (the ones
# explained away are in packaging/deb/lintian-overrides).
lint-deb: deb
	@if ! command -v lintian >/dev/null; then \
	    echo "lint-deb: installing lintian"; \
	    $(SUDO) apt-get update -q; \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q lintian; \
	fi
	lintian --fail-on error,warning --info $(DEB)

# Each target runs FUZZ_SECONDS on the committed seeds plus what earlier runs found
# ($(FUZZ_BUILD)/corpus/<target>, never written into the repository). A crash stops
# make; its input is left in $(FUZZ_BUILD)/artifacts/ and becomes a unit test.
# Swift's own backtracer is off (SWIFT_BACKTRACE=enable=no): under ASan it hung
# on a crash reading the crashed process's memory, and make waited with it;
# libFuzzer and ASan print the trace.
#
# One -sanitize=fuzzer,address flag, not SwiftPM's --sanitize=fuzzer
# --sanitize=address: SwiftPM keeps those in a Set, so they reach swiftc in a
# random order, and swiftc honours only the last -sanitize= it is given. Each
# build had either coverage (no ASan) or ASan (no coverage: libFuzzer fuzzed
# blind). SwiftPM's --sanitize=fuzzer stays, first, so that it links the
# executable with libFuzzer's main; the -Xswiftc flag comes after it and wins.
# Each binary is checked for both before it runs: coverage counters on its
# seeds ("INITED cov:") and the ASan runtime.
FUZZ_INSTRUMENTED = $(FUZZ_BUILD)/release/$$t -runs=0 Tests/Fuzz/corpus/$$t 2>&1 | grep 'INITED cov:' >/dev/null \
	        && nm $(FUZZ_BUILD)/release/$$t | grep ' __asan_init$$' >/dev/null
fuzz:
	@for t in $(FUZZ_TARGETS); do \
	    $(SWIFT) build -c release --product $$t --build-path $(FUZZ_BUILD) \
	        --sanitize=fuzzer -Xswiftc -sanitize=fuzzer,address -Xswiftc -parse-as-library 2>&1 | grep -v 'Cannot export local symbol'; \
	    $(FUZZ_INSTRUMENTED) || { echo "fuzz: $$t lacks coverage or ASan instrumentation"; exit 1; }; \
	done
	@mkdir -p $(FUZZ_BUILD)/artifacts
	@for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(FUZZ_BUILD)/corpus/$$t; \
	    echo "== fuzz $$t for $(FUZZ_SECONDS) s"; \
	    SWIFT_BACKTRACE=enable=no $(FUZZ_BUILD)/release/$$t $(FUZZ_BUILD)/corpus/$$t Tests/Fuzz/corpus/$$t \
	        -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
	        -artifact_prefix=$(FUZZ_BUILD)/artifacts/$$t- 2>&1 | grep -vE '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)|dictionary|^"' ; \
	done

clean:
	rm -rf .build .build-static .build-bench $(FUZZ_BUILD) $(ASAN_BUILD)
	rm -f roomcast_*.deb

# Benchmarks (BENCHMARKS.md). Their own build path, so they never relink the
# .build/release binaries of `make` or a test run that is going on.
BENCH_BUILD ?= $(CURDIR)/.build-bench
export BENCH_BUILD

.PHONY: bench bench-relay bench-plot bench-profile bench-cluster bench-tls bench-publish bench-history

# Every workload of BENCHMARKS.md against roomcastd, the C relay
# bench/ltb-relay.c (the practical limit) and Redis (installed if missing):
# three repetitions, medians, one table with both ratios (about 15 minutes
# plus the build; BENCH_QUICK=1: shorter runs, one repetition).
bench:
	bench/run.sh

# The C relay alone: built with gcc -O2 into $(BENCH_BUILD) (never committed)
# and checked (bench/check-relay.py); make bench does both too.
bench-relay:
	@mkdir -p $(BENCH_BUILD)
	$${CC:-gcc} -O2 -Wall -Wextra -std=c11 -o $(BENCH_BUILD)/ltb-relay bench/ltb-relay.c
	python3 bench/check-relay.py $(BENCH_BUILD)/ltb-relay

# The scaling curve: bench/scaling.png (gnuplot-nox installed if missing).
bench-plot:
	bench/plot.sh

# Instructions per delivered frame under callgrind, top functions, syscalls.
bench-profile:
	bench/profile.sh

# Publishes per second through the backend API into a room of 1,000 members
# (1 and 4 keep-alive connections) and of 50, beside the LTB fan-out of the same
# daemon, all drained by roomcast-bench (bench/publish.sh, about 6 minutes plus the build).
bench-publish:
	bench/publish.sh

# The TLS rows (bench/tls.sh): fan-out over TLS beside plain, RSS per idle TLS connection.
bench-tls:
	bench/tls.sh

# Recent lines on join: fan-out to 1,000 members with [rooms] history = 50
# against history = 0, alternating over rounds, and callgrind's instructions
# per delivery of both (bench/history.sh, about 6 minutes plus the build).
bench-history:
	bench/history.sh

# One hot room on one daemon against the same room split across two
# daemons of a cluster (Redis pub/sub), and Redis's cost per frame (~2 minutes
# plus the build); the projection to N daemons is in BENCHMARKS.md.
bench-cluster:
	bench/cluster.sh
