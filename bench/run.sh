#!/usr/bin/env bash
# make bench: every workload of issue 5 against a release roomcastd and, when
# redis-server is (or can be) installed, against Redis pub/sub in the same run.
# Prints one table with both servers and the ratios; keeps the raw JSON lines
# in bench/results/latest.jsonl and the table in bench/results/latest.md.
#
#   bench/run.sh                 all workloads (about 3 minutes plus the build)
#   bench/run.sh fanout latency  only those (idle fanout latency large storm)
#   BENCH_QUICK=1 bench/run.sh   shorter runs, for a smoke test
#   BENCH_REPEAT=3 bench/run.sh  three repetitions (fresh servers each), medians in the table
#                                (about 3 minutes per repetition)
source "$(dirname "$0")/lib.sh"

WORKLOADS=("$@")
[ ${#WORKLOADS[@]} -gt 0 ] || WORKLOADS=(idle fanout latency large storm)
# Idle goes first, while both servers are fresh: their RSS then is the baseline.
if [[ " ${WORKLOADS[*]} " == *" idle "* ]]; then
    rest=(); for w in "${WORKLOADS[@]}"; do [ "$w" = idle ] || rest+=("$w"); done
    WORKLOADS=(idle "${rest[@]}")
fi
if [ "${BENCH_QUICK:-}" = 1 ]; then
    DUR=(--duration 3); IDLE=(--connections 5000 --rss-steps 1000 --duration 10)
else
    DUR=(); IDLE=()
fi

build
mkdir -p "$RESULTS"
OUT=$RESULTS/run-$(date -u +%Y%m%dT%H%M%SZ).jsonl
machine_json >"$OUT"

TARGETS=(roomcast)
if ensure_redis; then TARGETS+=(redis); else log "redis-server not available: roomcastd only"; fi

REPEAT=${BENCH_REPEAT:-1}
for rep in $(seq "$REPEAT"); do
    # Fresh servers for every repetition (the idle workload's RSS baseline);
    # the order of the two targets alternates, so a drift in the machine's
    # load does not always favour the same one.
    start_roomcastd
    [[ " ${TARGETS[*]} " == *" redis "* ]] && start_redis
    order=("${TARGETS[@]}")
    if [ $((rep % 2)) = 0 ] && [ ${#TARGETS[@]} = 2 ]; then order=(redis roomcast); fi
    for w in "${WORKLOADS[@]}"; do
        for t in "${order[@]}"; do
            log "$w: $t (repetition $rep of $REPEAT)"
            case $w in
                idle) bench_run "$t" --mode idle --label "rep-$rep" "${IDLE[@]}" >>"$OUT" ;;
                fanout|latency|large) bench_run "$t" --mode "$w" --label "rep-$rep" "${DUR[@]}" >>"$OUT" ;;
                storm) bench_run "$t" --mode storm --label "rep-$rep" >>"$OUT" ;;
                *) log "unknown workload $w"; exit 64 ;;
            esac
        done
    done
    stop_roomcastd
    stop_redis
done

cp "$OUT" "$RESULTS/latest.jsonl"
python3 "$ROOT/bench/table.py" "$OUT" --markdown "$RESULTS/latest.md"
log "raw results: $OUT"
