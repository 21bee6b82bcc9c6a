#!/usr/bin/env bash
# Checks systemd/roomcastd.{socket,service} the way systemd 252 would load them.
# `systemd-analyze verify` exits 0 even on unknown keys and bad values (it only
# warns), so any output at all is a failure. ExecStart= must name an existing
# executable, so the units are rendered into a scratch folder with @BINDIR@
# pointing at a stub there, by systemd/render, as `make install` renders them.
# Also fails if the self-binding service scores worse than MAX_EXPOSURE.
set -euo pipefail

MAX_EXPOSURE=${MAX_EXPOSURE:-2.0}
top=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/bin" "$tmp/units"
install -m 0755 /bin/true "$tmp/bin/roomcastd"
"$top/systemd/render" "$tmp/bin" /etc "$tmp/units"

out=$(systemd-analyze verify --man=no "$tmp/units/roomcastd.socket" "$tmp/units/roomcastd.service" 2>&1) || true
if [ -n "$out" ]; then
    echo "check-units: systemd-analyze verify complained:" >&2
    echo "$out" >&2
    exit 1
fi
echo "check-units: systemd-analyze verify: clean"

score=$(systemd-analyze security --offline=true "$tmp/units/roomcastd.service" 2>&1 | sed -n 's/.*Overall exposure level for .*: \([0-9.]*\).*/\1/p')
if [ -z "$score" ]; then
    echo "check-units: systemd-analyze security printed no exposure level" >&2
    exit 1
fi
echo "check-units: systemd-analyze security: exposure $score (limit $MAX_EXPOSURE)"
if ! awk -v s="$score" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(s <= m) }'; then
    echo "check-units: exposure $score is above $MAX_EXPOSURE" >&2
    exit 1
fi
