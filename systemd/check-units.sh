#!/usr/bin/env bash
# Checks the units in systemd/ the way systemd 252 would load them.
# - `systemd-analyze verify` exits 0 even on unknown keys and bad values (it
#   only warns), so any output at all is a failure. ExecStart= must name an
#   existing executable, so the units are rendered into a scratch folder with
#   @BINDIR@ pointing at a stub there, by systemd/render, as `make install`
#   renders them. --man=no: the man pages are not installed on this host.
# - `systemd-analyze security --offline=true` must score the socket-activated
#   roomcastd.service at most MAX_EXPOSURE_SOCKET and the self-binding
#   roomcastd-standalone.service at most MAX_EXPOSURE_STANDALONE.
# - The two services must not drift apart: their [Service] settings may differ
#   only in the network keys listed in NETWORK_KEYS below.
set -euo pipefail

MAX_EXPOSURE_SOCKET=${MAX_EXPOSURE_SOCKET:-1.0}
MAX_EXPOSURE_STANDALONE=${MAX_EXPOSURE_STANDALONE:-1.5}
NETWORK_KEYS='PrivateNetwork|RestrictAddressFamilies|IPAddressDeny|IPAddressAllow|SocketBindDeny|SocketBindAllow'
top=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/bin" "$tmp/units"
install -m 0755 /bin/true "$tmp/bin/roomcastd"
"$top/systemd/render" "$tmp/bin" /etc "$tmp/units"
units=(roomcastd.socket roomcastd-json.socket roomcastd-websocket.socket roomcastd.service roomcastd-standalone.service)

out=$(cd "$tmp/units" && systemd-analyze verify --man=no "${units[@]}" 2>&1) || true
if [ -n "$out" ]; then
    echo "check-units: systemd-analyze verify complained:" >&2
    echo "$out" >&2
    exit 1
fi
echo "check-units: systemd-analyze verify: clean (${units[*]})"

failed=0
check_score() {  # UNIT LIMIT
    local score
    score=$(cd "$tmp/units" && systemd-analyze security --offline=true "$1" 2>&1 \
            | sed -n 's/.*Overall exposure level for .*: \([0-9.]*\).*/\1/p')
    if [ -z "$score" ]; then
        echo "check-units: systemd-analyze security printed no exposure level for $1" >&2
        failed=1
        return
    fi
    echo "check-units: systemd-analyze security $1: exposure $score (limit $2)"
    if ! awk -v s="$score" -v m="$2" 'BEGIN { exit !(s <= m) }'; then
        echo "check-units: $1: exposure $score is above $2" >&2
        failed=1
    fi
}
check_score roomcastd.service "$MAX_EXPOSURE_SOCKET"
check_score roomcastd-standalone.service "$MAX_EXPOSURE_STANDALONE"

service_settings() {  # UNIT: its [Service] key=value lines, minus the network keys
    awk '/^\[/ { s = ($0 == "[Service]") } s && /^[A-Za-z]/' "$tmp/units/$1" | grep -Ev "^($NETWORK_KEYS)="
}
if ! drift=$(diff <(service_settings roomcastd.service) <(service_settings roomcastd-standalone.service)); then
    echo "check-units: roomcastd.service and roomcastd-standalone.service differ outside the network keys:" >&2
    echo "$drift" >&2
    failed=1
else
    echo "check-units: the two services share every [Service] setting but the network keys"
fi
# systemd 252 does not pass FileDescriptorStoreMax= to the service ($FDSTORE
# is set by 254 and later), so the units set FDSTORE= themselves: the daemon
# hands its connections over only when it is > 0 (docs/operations/restarts.md, restarts).
for unit in roomcastd.service roomcastd-standalone.service; do
    max=$(sed -n 's/^FileDescriptorStoreMax=//p' "$tmp/units/$unit")
    env=$(sed -n 's/^Environment=FDSTORE=//p' "$tmp/units/$unit")
    if [ -z "$max" ] || [ "$max" != "$env" ]; then
        echo "check-units: $unit: FileDescriptorStoreMax=$max and Environment=FDSTORE=$env must be set and equal" >&2
        failed=1
    fi
done
[ "$failed" = 0 ] && echo "check-units: FileDescriptorStoreMax= and FDSTORE= agree in both services"
exit "$failed"
