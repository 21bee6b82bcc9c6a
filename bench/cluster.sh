#!/usr/bin/env bash
# make bench-cluster: one hot room on one daemon against the same
# room split across two daemons of a cluster (Redis pub/sub), and what Redis
# costs per frame on each daemon and in redis-server. BENCHMARKS.md
# ("Cluster") projects N daemons from these figures.
#
# Three set-ups:
#   single   one roomcastd, no cluster                          (the baseline)
#   member   one roomcastd in a cluster of one, on redis-server  (what being in a cluster costs it)
#   split    two roomcastd in one cluster, members spread evenly (the room across daemons)
# and two workloads, one publisher (on the first daemon) and 64-byte opaque frames:
#   hot      1,000 members, closed loop (window 128): the throughput of a hot room
#   perframe 10 members, closed loop (window 64): CPU per frame at saturation, where the
#            fan-out is small enough that Redis's share shows
# Before the generator joins, a seed client joins the room on each daemon,
# so both daemons are subscribed before the first member's join (a join
# published before a daemon subscribes reaches none of its members, and the
# generator waits for every join). The seeds add one delivery per frame per daemon.
#
# Pinning on this 2-core machine: daemon A (the publisher's) and redis-server
# on core 0, daemon B and the generator on core 1. Nothing has a core of its
# own in `split`, so read CPU per frame (which divides out the share each
# process got), not the absolute rates.
#
#   bench/cluster.sh                   every set-up and workload (about 2 minutes plus the build)
#   BENCH_REPEAT=3 bench/cluster.sh    three repetitions on fresh servers, medians
#   BENCH_QUICK=1 bench/cluster.sh     shorter runs, for a smoke test
source "$(dirname "$0")/lib.sh"

PORT_A=${ROOMCAST_PORT}
PORT_B=${ROOMCAST_PORT_B:-19899}
CLUSTER_REDIS_PORT=${CLUSTER_REDIS_PORT:-16380}
HOT_MEMBERS=${CLUSTER_MEMBERS:-1000}
PERFRAME_MEMBERS=10

ROOM=hot
if [ "${BENCH_QUICK:-}" = 1 ]; then DUR=(--duration 3); else DUR=(--duration 10); fi

B_PID=""
CR_PID=""
SEED_PIDS=()

stop_cluster_extras() {
    for p in "${SEED_PIDS[@]}"; do stop_pid "$p"; done
    SEED_PIDS=()
    stop_pid "$B_PID"; B_PID=""
    stop_pid "$CR_PID"; CR_PID=""
}
trap 'stop_cluster_extras; cleanup' EXIT

# cluster_conf FILE: the bench config plus [cluster] on our redis-server.
cluster_conf() {
    { cat "$CONF"; printf '\n[cluster]\nredis = 127.0.0.1:%s\nname = bench\n' "$CLUSTER_REDIS_PORT"; } >"$1"
}

start_cluster_redis() {
    port_free "$CLUSTER_REDIS_PORT" || { log "port $CLUSTER_REDIS_PORT is busy (set CLUSTER_REDIS_PORT)"; return 1; }
    # No persistence; the subscriber output limit roomcast's docs recommend.
    taskset -c "$SERVER_CPU" redis-server --port "$CLUSTER_REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
        --daemonize no --client-output-buffer-limit 'pubsub 64mb 16mb 30' --loglevel warning >"$LOGDIR/cluster-redis.log" 2>&1 &
    CR_PID=$!
    wait_listening "$CLUSTER_REDIS_PORT" "$CR_PID" cluster-redis
}

# start_daemon NAME PORT CPU CONF: prints the pid.
start_daemon() {
    local name=$1 port=$2 cpu=$3 conf=$4
    port_free "$port" || { log "port $port is busy"; return 1; }
    taskset -c "$cpu" "$BIN/roomcastd" --config "$conf" --listen "127.0.0.1:$port" >"$LOGDIR/$name.log" 2>&1 &
    local pid=$!
    wait_listening "$port" "$pid" "$name" >&2
    echo "$pid"
}

# seed PORT: a client that joins $ROOM, reads everything and heartbeats (python3).
seed() {
    python3 - "$1" "$ROOM" <<'EOF' &
import select, socket, struct, sys, time
port, room = int(sys.argv[1]), sys.argv[2].encode()
def field(tag, b): return bytes([tag, len(b)]) + b
body = b"\x08\x00" + field(0x12, b"seed") + field(0x1a, b"") + field(0x22, room)
s = socket.create_connection(("127.0.0.1", port))
s.sendall(struct.pack("<IH", len(body), 0) + body)
beat = struct.pack("<IH", 0, 8)
last = time.monotonic()
while True:
    r, _, _ = select.select([s], [], [], 1.0)
    if r and not s.recv(1 << 18):
        break
    if time.monotonic() - last > 10:
        s.sendall(beat); last = time.monotonic()
EOF
    SEED_PIDS+=($!)
}

# wait_subscribed COUNT: until the room's channel has COUNT subscribers.
wait_subscribed() {
    for _ in $(seq 100); do
        [ "$(redis-cli -p "$CLUSTER_REDIS_PORT" PUBSUB NUMSUB "roomcast:bench:room:$ROOM" | tail -n1)" = "$1" ] && return 0
        sleep 0.1
    done
    log "the room has not $1 subscribers after 10 s"; return 1
}

# run SETUP WORKLOAD ARGS...: one generator run, tagged; prints its JSON line.
run() {
    local setup=$1 workload=$2; shift 2
    local args=(--mode fanout --room "$ROOM" --label "$setup/$workload/rep-$rep" "${DUR[@]}")
    case $workload in
        hot) args+=(--members "$HOT_MEMBERS") ;;
        perframe) args+=(--members "$PERFRAME_MEMBERS" --window 64) ;;
    esac
    timeout 300 taskset -c "$GEN_CPU" "$BIN/roomcast-bench" --target roomcast --json "${args[@]}" "$@" \
        | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); d["setup"], d["workload"] = sys.argv[1], sys.argv[2]; print(json.dumps(d))' "$setup" "$workload" \
        || log "roomcast-bench $setup $workload failed"
}

build
ensure_redis || { log "redis-server is needed: apt-get install redis-server"; exit 1; }
mkdir -p "$RESULTS"
OUT=$RESULTS/cluster-$(date -u +%Y%m%dT%H%M%SZ).jsonl
machine_json >"$OUT"
cluster_conf "$LOGDIR/cluster.conf"

REPEAT=${BENCH_REPEAT:-1}
for rep in $(seq "$REPEAT"); do
    for workload in hot perframe; do
        log "single, $workload (repetition $rep of $REPEAT)"
        A=$(start_daemon single "$PORT_A" "$SERVER_CPU" "$CONF")
        seed "$PORT_A"; sleep 0.3
        run single "$workload" --port "$PORT_A" --server-pid "$A" >>"$OUT"
        stop_cluster_extras; stop_pid "$A"

        log "member: one daemon in a cluster, $workload (repetition $rep of $REPEAT)"
        start_cluster_redis
        A=$(start_daemon member "$PORT_A" "$SERVER_CPU" "$LOGDIR/cluster.conf")
        seed "$PORT_A"; wait_subscribed 1
        run member "$workload" --port "$PORT_A" --server-pid "$A" --cpu-pids "$CR_PID" >>"$OUT"
        stop_cluster_extras; stop_pid "$A"

        log "split: two daemons, members spread evenly, $workload (repetition $rep of $REPEAT)"
        start_cluster_redis
        A=$(start_daemon split-a "$PORT_A" "$SERVER_CPU" "$LOGDIR/cluster.conf")
        B_PID=$(start_daemon split-b "$PORT_B" "$GEN_CPU" "$LOGDIR/cluster.conf")
        seed "$PORT_A"; seed "$PORT_B"; wait_subscribed 2
        run split "$workload" --port "$PORT_A,$PORT_B" --server-pid "$A" --cpu-pids "$B_PID,$CR_PID" >>"$OUT"
        grep -h -E 'cluster_(gap|down|output_limit)' "$LOGDIR"/split-*.log >&2 || true
        stop_cluster_extras; stop_pid "$A"
    done
done

cp "$OUT" "$RESULTS/cluster-latest.jsonl"
python3 "$ROOT/bench/cluster_table.py" "$OUT" --markdown "$RESULTS/cluster-latest.md"
log "raw results: $OUT"
