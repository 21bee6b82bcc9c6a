# Shared by the bench/*.sh scripts: run.sh, plot.sh, profile.sh, history.sh... (sourced, bash).
#
# Starts the servers under test on loopback ports, pinned to core 0 with
# taskset, and stops everything it started on exit (trap). The generator runs
# pinned to core 1 (bench_run). The servers: roomcastd, the C relay
# bench/ltb-relay.c (the yardstick) and redis-server.
#
# Environment:
#   BENCH_BUILD     SwiftPM scratch path of the release build (.build-bench);
#                   the C relay is built there too ($BENCH_BUILD/ltb-relay)
#   ROOMCAST_PORT   roomcastd's loopback port (19898)
#   WS_PORT         roomcastd's WebSocket listener (19897; the roomcast-ws runs)
#   RELAY_PORT      the C relay's loopback port (19899)
#   REDIS_PORT      redis-server's loopback port (16379)
#   SERVER_CPU      core of the servers (0); GEN_CPU: core of the generator (1)
#   RESULTS         where JSON lines and tables go (bench/results)

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_BUILD=${BENCH_BUILD:-$ROOT/.build-bench}
ROOMCAST_PORT=${ROOMCAST_PORT:-19898}
WS_PORT=${WS_PORT:-19897}
RELAY_PORT=${RELAY_PORT:-19899}
REDIS_PORT=${REDIS_PORT:-16379}
SERVER_CPU=${SERVER_CPU:-0}
GEN_CPU=${GEN_CPU:-1}
RESULTS=${RESULTS:-$ROOT/bench/results}
BIN=$BENCH_BUILD/release
CONF=$ROOT/bench/roomcastd-bench.conf
LOGDIR=$(mktemp -d /tmp/roomcast-bench.XXXXXX)

ROOMCAST_PID=""
RELAY_PID=""
REDIS_PID=""
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)

log() { printf '== %s\n' "$*" >&2; }

# The process may hold at most the hard descriptor limit: raise the soft one
# to it (children inherit it: roomcastd, redis-server, roomcast-bench).
ulimit -n "$(ulimit -Hn)"

if [ "$(nproc)" -lt 2 ]; then
    log "only $(nproc) core: server and generator share it (figures are not comparable)"
    GEN_CPU=$SERVER_CPU
fi

stop_pid() {
    local pid=$1
    [ -n "$pid" ] || return 0
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

stop_roomcastd() { stop_pid "$ROOMCAST_PID"; ROOMCAST_PID=""; }
stop_relay() { stop_pid "$RELAY_PID"; RELAY_PID=""; }
stop_redis() { stop_pid "$REDIS_PID"; REDIS_PID=""; }

cleanup() {
    stop_roomcastd
    stop_relay
    stop_redis
    # Keep the servers' logs of the last run (warnings: slow consumers, refusals...).
    mkdir -p "$RESULTS/last-logs" 2>/dev/null && cp "$LOGDIR"/*.log "$RESULTS/last-logs/" 2>/dev/null || true
    rm -rf "$LOGDIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# C objects get DWARF 4 debug info: valgrind 3.19 (make bench-profile) cannot
# read clang's DWARF 5 of CEarlySignals and gives up on the whole binary
# ("Possibly corrupted debuginfo file").
build() {
    log "building release into $BENCH_BUILD"
    (cd "$ROOT" && swift build -c release --scratch-path "$BENCH_BUILD" -Xcc -gdwarf-4 --product roomcastd >&2 \
        && swift build -c release --scratch-path "$BENCH_BUILD" -Xcc -gdwarf-4 --product roomcast-bench >&2)
    build_relay
}

# The C relay: built with gcc -O2 beside the Swift binaries, never committed.
build_relay() {
    mkdir -p "$BENCH_BUILD"
    ${CC:-gcc} -O2 -Wall -Wextra -std=c11 -o "$BENCH_BUILD/ltb-relay" "$ROOT/bench/ltb-relay.c" >&2
}

port_free() { ! ss -Htln "sport = :$1" | grep -q .; }

wait_listening() {
    local port=$1 pid=$2 name=$3
    for _ in $(seq 100); do
        ss -Htln "sport = :$port" | grep -q . && return 0
        kill -0 "$pid" 2>/dev/null || { log "$name exited at start:"; cat "$LOGDIR/$name.log" >&2; return 1; }
        sleep 0.1
    done
    log "$name is not listening on $port after 10 s"
    return 1
}

# start_roomcastd [CONFIG]: the bench config unless another is given.
start_roomcastd() {
    port_free "$ROOMCAST_PORT" || { log "port $ROOMCAST_PORT is busy (set ROOMCAST_PORT)"; return 1; }
    port_free "$WS_PORT" || { log "port $WS_PORT is busy (set WS_PORT)"; return 1; }
    # The same daemon serves the WebSocket members of the roomcast-ws runs.
    local conf=$LOGDIR/$(basename "${1:-$CONF}" .conf)-ws.conf
    { cat "${1:-$CONF}"; printf '\n[websocket]\nlisten = 127.0.0.1:%s\n' "$WS_PORT"; } >"$conf"
    taskset -c "$SERVER_CPU" "$BIN/roomcastd" --config "$conf" --listen "127.0.0.1:$ROOMCAST_PORT" \
        >"$LOGDIR/roomcastd.log" 2>&1 &
    ROOMCAST_PID=$!
    wait_listening "$ROOMCAST_PORT" "$ROOMCAST_PID" roomcastd
    wait_listening "$WS_PORT" "$ROOMCAST_PID" roomcastd
}

# start_relay [--echo]: the C relay on RELAY_PORT.
start_relay() {
    port_free "$RELAY_PORT" || { log "port $RELAY_PORT is busy (set RELAY_PORT)"; return 1; }
    taskset -c "$SERVER_CPU" "$BENCH_BUILD/ltb-relay" "$@" "$RELAY_PORT" >"$LOGDIR/ltb-relay.log" 2>&1 &
    RELAY_PID=$!
    wait_listening "$RELAY_PORT" "$RELAY_PID" ltb-relay
}

# Installs redis-server from Debian when it is missing and apt-get is there.
# Returns non-zero (and the runs go on with roomcastd alone) when it cannot.
ensure_redis() {
    command -v redis-server >/dev/null && return 0
    [ "${BENCH_NO_INSTALL:-}" = 1 ] && return 1
    command -v apt-get >/dev/null || return 1
    log "redis-server is missing: apt-get install -y redis-server"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >&2 \
        || { $SUDO apt-get update -q >&2 && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >&2; } \
        || return 1
    command -v redis-server >/dev/null
}

start_redis() {
    port_free "$REDIS_PORT" || { log "port $REDIS_PORT is busy (set REDIS_PORT)"; return 1; }
    # No persistence; no output limit for subscribers (as the C relay's 64 MiB,
    # more generous than roomcastd's defaults in its bench config: a client
    # only roomcastd cuts is roomcastd's failure); maxclients fits 19,000 idle
    # clients under a 20,000 fd limit.
    taskset -c "$SERVER_CPU" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
        --daemonize no --client-output-buffer-limit 'pubsub 0 0 0' --maxclients 19900 --tcp-backlog 1024 \
        --loglevel warning >"$LOGDIR/redis.log" 2>&1 &
    REDIS_PID=$!
    wait_listening "$REDIS_PORT" "$REDIS_PID" redis
}

# bench_run SERVER ARGS...: one roomcast-bench run against SERVER
# (roomcast|roomcast-ws|relay|redis), pinned to the generator's core; prints its JSON
# line. The relay speaks LTB: the generator treats it as a roomcast target.
# roomcast-ws is the same roomcastd with its members on WebSocket (roomcast.ltb.v1).
bench_run() {
    local server=$1; shift
    local target=roomcast port pid
    case $server in
        roomcast) port=$ROOMCAST_PORT; pid=$ROOMCAST_PID ;;
        roomcast-ws) port=$ROOMCAST_PORT; pid=$ROOMCAST_PID; set -- --websocket-port "$WS_PORT" "$@" ;;
        relay) port=$RELAY_PORT; pid=$RELAY_PID ;;
        redis) target=redis; port=$REDIS_PORT; pid=$REDIS_PID ;;
    esac
    [ -n "$pid" ] || return 0
    # Bounded: no single run may take more than 5 minutes.
    timeout 300 taskset -c "$GEN_CPU" "$BIN/roomcast-bench" --target "$target" --server "$server" --port "$port" \
        --server-pid "$pid" --json "$@" || { log "roomcast-bench $server $* failed"; return 0; }
}

machine_json() {
    local model kernel
    model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
    kernel=$(uname -r)
    printf '{"machine": true, "nproc": %s, "cpu": "%s", "kernel": "%s", "date": "%s", "commit": "%s", "redis": "%s", "loadavg": "%s"}\n' \
        "$(nproc)" "$model" "$kernel" "$(date -u +%Y-%m-%dT%H:%MZ)" \
        "$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
        "$(redis-server --version 2>/dev/null | sed -n 's/.*v=\([^ ]*\).*/\1/p')" \
        "$(cut -d' ' -f1-3 /proc/loadavg)"
}

# Installs valgrind from Debian when it is missing (make bench-profile,
# make bench-history's instruction counts).
ensure_valgrind() {
    command -v valgrind >/dev/null && return 0
    log "valgrind is missing: apt-get install -y valgrind"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q valgrind >&2
}

# callgrind_run CONFIG FRAMES OUTFILE ARGS...: the release roomcastd with
# CONFIG under valgrind's callgrind for one bounded closed-loop fan-out of
# roomcast-bench (1 publisher, 64-byte bodies, window 32, FRAMES frames, no
# heartbeats; ARGS add to or override that: --members N, --body text), then
# SIGTERM. Sets IR (callgrind's instruction count of the whole run, start-up
# and joins included) and OUTFILE (the callgrind file it wrote); exits when
# the run lost a frame or the daemon closed a connection (the count would
# not be of the workload). Use timeout = 0 in CONFIG: the generator sends no
# heartbeats.
callgrind_run() {
    local conf=$1 frames=$2 out=$3; shift 3
    local name
    name=$(basename "$out" .out)
    port_free "$ROOMCAST_PORT" || { log "port $ROOMCAST_PORT is busy"; exit 1; }
    taskset -c "$SERVER_CPU" valgrind --tool=callgrind --callgrind-out-file="$out" \
        "$BIN/roomcastd" --config "$conf" --listen "127.0.0.1:$ROOMCAST_PORT" >"$LOGDIR/$name.log" 2>&1 &
    ROOMCAST_PID=$!
    for _ in $(seq 600); do ss -Htln "sport = :$ROOMCAST_PORT" | grep -q . && break; sleep 0.1; done
    timeout 600 taskset -c "$GEN_CPU" "$BIN/roomcast-bench" --port "$ROOMCAST_PORT" \
        --publishers 1 --size 64 --window 32 --frames "$frames" --heartbeat 0 --drain 30 --json "$@" \
        >"$LOGDIR/$name.json"
    stop_roomcastd
    # "summary: N" (or "totals: N") is the whole run's instruction count.
    IR=$(sed -n 's/^\(summary\|totals\): *\([0-9]*\).*/\2/p' "$out" | head -1)
    OUTFILE=$out
    python3 - "$LOGDIR/$name.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
if d["loss"] != 0 or d["closed_by_server"] != 0:
    sys.exit(f"profile run not clean: loss {d['loss']}, closed {d['closed_by_server']}")
PY
}
