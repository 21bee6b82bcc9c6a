#!/usr/bin/env python3
"""Turns the JSON lines of one bench/run.sh run into the comparison table.

    table.py RUN.jsonl [--markdown OUT.md]

Each row is one figure of one workload: roomcastd, the C relay
(bench/ltb-relay.c, one-room workloads only), Redis, the ratios
roomcastd / C relay and roomcastd / Redis, and the targets. With
several repetitions (labels rep-1, rep-2, ...), values are medians and each
ratio is the median of the ratios within each repetition (the two runs of a
ratio shared the machine's load). Standard library only.
"""
import json
import sys

SERVERS = ("roomcast", "relay", "redis")


def read_results(path, key):
    """The machine line and the runs of a results file, grouped by key(run)."""
    machine, runs = {}, {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            d = json.loads(line)
            if d.get("machine"):
                machine = d
            else:
                runs.setdefault(key(d), []).append(d)
    return machine, runs


def load(path):
    # Runs from before the C relay carry no "server": their target names it.
    machine, runs = read_results(path, lambda d: (d["mode"], d.get("server", d["target"])))
    ratios = {other: paired_ratios(runs, other) for other in ("relay", "redis")}
    ratios["ws"] = paired_ratios(runs, "roomcast", mine="roomcast-ws")
    return machine, {k: median_run(v) for k, v in runs.items()}, ratios


def median(vals):
    vals = sorted(vals)
    if not vals:
        return float("nan")
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def paired_ratios(runs, other, mine="roomcast"):
    """{(mode, key): median over repetitions of mine / other (roomcastd by
    default)}, pairing the runs of one repetition (same label)."""
    out = {}
    for (mode, server), reps in runs.items():
        if server != mine:
            continue
        theirs = {r.get("label"): r for r in runs.get((mode, other), [])}
        for key in reps[0]:
            rs = []
            for r in reps:
                o = theirs.get(r.get("label"))
                a, b = r.get(key), (o or {}).get(key)
                if number(a) and number(b) and b:
                    rs.append(a / b)
            if rs:
                out[(mode, key)] = median(rs)
    return out


# Counts that make a run a failure whatever its speed: a client the server cut,
# a delivery lost or out of order (the maximum over repetitions, not the median).
FAILURES = ("closed_by_server", "loss", "order_errors")


def median_run(reps):
    """One run whose numbers are the medians over repetitions (n = len(reps))."""
    if len(reps) == 1:
        reps[0]["repetitions"] = 1
        return reps[0]
    out = dict(reps[-1])
    for key, value in reps[0].items():
        if key in FAILURES:
            out[key] = max(r.get(key) or 0 for r in reps)  # one repetition's failure is the run's
        elif number(value):
            out[key] = median([r[key] for r in reps if number(r.get(key))])
        elif isinstance(value, bool):
            out[key] = all(r.get(key) for r in reps) if key.endswith("complete") else any(r.get(key) for r in reps)
    out["repetitions"] = len(reps)
    return out


# A target: (text, check(ratio vs relay, ratio vs Redis, roomcastd's value)).
def at_least(x, which):
    return (f">= {x}x {'C relay' if which == 'relay' else 'Redis'}",
            lambda rr, rd, v: (rr if which == "relay" else rd) is not None and (rr if which == "relay" else rd) >= x,
            which)


def at_most(x, which):
    return (f"<= {x}x {'C relay' if which == 'relay' else 'Redis'}",
            lambda rr, rd, v: (rr if which == "relay" else rd) is not None and (rr if which == "relay" else rd) <= x,
            which)


def absolute(text, check):
    return (text, lambda rr, rd, v: v is not None and check(v), None)


# (workload, key, label, unit, targets). The first row of each workload is
# the one its target names; the target against the C relay comes first.
ROWS = [
    ("fanout", "deliveries_per_s", "deliveries/s", "", [at_least(0.9, "relay"), at_least(2, "redis")]),
    ("fanout", "deliveries_per_server_cpu_s", "deliveries per server CPU-s", "", []),
    ("fanout", "deliveries_per_cpu_s", "deliveries per CPU-s, server + generator", "", []),
    ("fanout", "lat_p99_us", "latency p99", "ms", []),
    ("fanout", "server_cpu_pct", "server CPU", "%", []),
    ("fanout", "gen_cpu_pct", "generator CPU", "%", []),
    ("fanout", "gen_reads_per_delivery", "generator reads per delivery", "", []),
    ("fanout", "server_wait_pct", "server waiting for a CPU", "%", []),
    ("pub10", "deliveries_per_s", "deliveries/s", "", [at_least(0.9, "relay")]),
    ("pub10", "deliveries_per_server_cpu_s", "deliveries per server CPU-s", "", []),
    ("pub10", "deliveries_per_cpu_s", "deliveries per CPU-s, server + generator", "", []),
    ("pub10", "lat_p99_us", "latency p99", "ms", []),
    ("pub10", "server_cpu_pct", "server CPU", "%", []),
    ("pub10", "gen_cpu_pct", "generator CPU", "%", []),
    ("pub10", "gen_reads_per_delivery", "generator reads per delivery", "", []),
    ("pub10", "server_wait_pct", "server waiting for a CPU", "%", []),
    ("large", "deliveries_per_s", "deliveries/s", "", [at_least(0.9, "relay"), at_least(1, "redis")]),
    ("large", "deliveries_per_server_cpu_s", "deliveries per server CPU-s", "", []),
    ("large", "deliveries_per_cpu_s", "deliveries per CPU-s, server + generator", "", []),
    ("large", "mib_per_s", "body MiB/s", "", []),
    ("large", "lat_p99_us", "latency p99", "ms", []),
    ("large", "server_cpu_pct", "server CPU", "%", []),
    ("large", "gen_cpu_pct", "generator CPU", "%", []),
    ("large", "gen_reads_per_delivery", "generator reads per delivery", "", []),
    ("large", "server_wait_pct", "server waiting for a CPU", "%", []),
    ("latency", "lat_p99_us", "latency p99", "ms", [at_most(1, "relay"), at_most(0.7, "redis")]),
    ("latency", "lat_p50_us", "latency p50", "ms", []),
    ("latency", "lat_max_us", "latency max", "ms", []),
    ("latency", "deliveries_per_s", "deliveries/s", "", []),
    ("latency", "server_cpu_pct", "server CPU", "%", []),
    ("latency", "gen_cpu_pct", "generator CPU", "%", []),
    ("latency", "server_wait_pct", "server waiting for a CPU", "%", []),
    ("idle", "rss_per_conn_bytes", "RSS per connection", "B", [absolute("<= 1024 B", lambda v: v <= 1024)]),
    ("idle", "server_cpu_pct", "server CPU, idle", "%", [absolute("< 2 %", lambda v: v < 2)]),
    ("idle", "connect_s", "connect + join, all", "s", []),
    ("storm", "storm_lat_p99_us", "probe p99 during storm", "ms", [absolute("< 50 ms", lambda v: v < 50_000)]),
    ("storm", "storm_complete", "all accepted + joined", "", [absolute("yes", lambda v: v is True)]),
    ("storm", "storm_s", "10k connects: all joined", "s", []),
    ("storm", "storm_lat_max_us", "probe max during storm", "ms", []),
]

WORKLOAD_NAMES = {
    "fanout": "fanout (1 pub x 1,000)",
    "pub10": "pub10 (10 pub x 100)",
    "large": "large (16 KiB x 100)",
    "latency": "latency (5,000 @ 200/s)",
    "idle": "idle (19,000 conns)",
    "storm": "storm (10k connects)",
}


def fmt(v, unit):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if unit == "ms":
        return f"{v / 1000:.2f}"
    if unit == "%":
        return f"{v:.1f}"
    if unit == "s":
        return f"{v:.2f}"
    if isinstance(v, float) and v < 10:
        return f"{v:.3f}"
    if isinstance(v, float) and v >= 100 or isinstance(v, int):
        return f"{v:,.0f}"
    return f"{v:.1f}"


def rows(runs, ratios):
    out = []
    for mode, key, label, unit, targets in ROWS:
        vals = [runs.get((mode, s), {}).get(key) for s in SERVERS]
        if all(v is None for v in vals):
            continue
        rr, rd = ratios["relay"].get((mode, key)), ratios["redis"].get((mode, key))
        texts, verdicts = [], []
        for text, check, which in targets:
            missing = which is not None and (rr if which == "relay" else rd) is None
            if which is None and vals[0] is None:
                missing = True
            texts.append(text)
            # roomcastd cutting a client or losing a frame fails the workload's
            # targets, however fast it was (the cut client's frames are not owed any more).
            failed = [f"{d[k]:,.0f} {k.replace('_', ' ')}" for k in FAILURES
                      for d in [runs.get((mode, "roomcast"), {})] if d.get(k)]
            verdicts.append("-" if missing else (f"NOT met ({', '.join(failed)})" if failed
                                                 else "met" if check(rr, rd, vals[0]) else "NOT met"))
        u = f" ({unit})" if unit else ""
        ratio = lambda r: f"{r:.2f}x" if r is not None else "-"
        name = WORKLOAD_NAMES.get(mode, mode)
        conns = runs.get((mode, "roomcast"), {}).get("connections")
        if mode == "idle" and conns:
            name = f"idle ({conns:,.0f} conns)"
        out.append([name, label + u] + [fmt(v, unit) for v in vals]
                   + [ratio(rr), ratio(rd), "; ".join(texts), "; ".join(verdicts)])
    return out


def notes(runs):
    out = []
    for (mode, server), d in sorted(runs.items()):
        name = f"{mode}/{server}"
        if d.get("gen_bound"):
            # gen_bound of a median run is true when any repetition was.
            reps = d.get("repetitions", 1)
            when = "" if reps == 1 else f" in at least one of {reps} repetitions (median {d['gen_cpu_pct']:.0f}%)"
            out.append(f"{name}: the generator used 90% of its core or more{when}: the figure may be the "
                       f"generator's limit; compare deliveries per server CPU-s")
        if d.get("loss"):
            out.append(f"{name}: loss {d['loss']:,.0f} of {d['expected']:,.0f} deliveries")
        if d.get("order_errors"):
            out.append(f"{name}: {d['order_errors']:,.0f} frames out of per-sender order")
        if d.get("closed_by_server"):
            out.append(f"{name}: {d['closed_by_server']} connections closed by the server")
        if d.get("first_problem"):
            out.append(f"{name}: {d['first_problem']}")
        if d.get("max_send_lag_us", 0) > 5000:
            turn = d.get("gen_max_turn_us")
            why = f"; its longest loop turn took {turn / 1000:.1f} ms" if turn is not None else ""
            out.append(f"{name}: open-loop sends ran up to {d['max_send_lag_us'] / 1000:.1f} ms late "
                       f"(generator busy or preempted{why})")
        closed = mode in ("fanout", "pub10", "large")
        wait, gwait = d.get("server_wait_pct"), d.get("gen_wait_pct")
        if wait is not None and wait >= 10:
            out.append(f"{name}: the server waited {wait:.0f}% of the window for a CPU (other work on its core): "
                       f"its figures are partly the machine's; compare the per-CPU-second rows")
        if gwait is not None and gwait >= 10:
            out.append(f"{name}: the generator waited {gwait:.0f}% of the window for a CPU (other work on its core)")
        if closed and d.get("server_cpu_pct", 100) < 80 and wait is None:
            # Runs from before the run-queue figures: no telling why.
            out.append(f"{name}: the server was busy {d['server_cpu_pct']:.0f}% of the window (a shared machine, "
                       f"a waiting loop or a stall): compare the per-CPU-second rows")
        elif closed and d.get("server_cpu_pct", 100) < 80 and wait < 10 and not d.get("gen_bound"):
            out.append(f"{name}: the server was busy {d['server_cpu_pct']:.0f}% of the window without waiting for "
                       f"a CPU: the closed loop waited on the generator ({d.get('gen_cpu_pct', 0):.0f}% busy) "
                       f"or stalled (latency max {d.get('lat_max_us', 0) / 1000:.0f} ms)")
    return out


# The same daemon's WebSocket members (roomcast-ws) beside its LTB members:
# (workload, key, label, unit, target ratio WebSocket / LTB, "min" or "max").
WS_ROWS = [
    ("fanout", "deliveries_per_s", "deliveries/s", "", 0.9, "min"),
    ("fanout", "deliveries_per_server_cpu_s", "deliveries per server CPU-s", "", None, None),
    ("fanout", "lat_p99_us", "latency p99", "ms", 1.1, "max"),
    ("large", "deliveries_per_s", "deliveries/s", "", 0.9, "min"),
    ("large", "deliveries_per_server_cpu_s", "deliveries per server CPU-s", "", None, None),
    ("large", "lat_p99_us", "latency p99", "ms", 1.1, "max"),
]


def ws_rows(runs, ratios):
    out = []
    for mode, key, label, unit, target, kind in WS_ROWS:
        ltb, ws = runs.get((mode, "roomcast"), {}).get(key), runs.get((mode, "roomcast-ws"), {}).get(key)
        if ws is None:
            continue
        r = ratios["ws"].get((mode, key))
        failed = [f"{d[k]:,.0f} {k.replace('_', ' ')}" for k in FAILURES
                  for d in [runs.get((mode, "roomcast-ws"), {})] if d.get(k)]
        text, verdict = "", ""
        if target is not None:
            text = f"{'>=' if kind == 'min' else '<='} {target}x LTB"
            ok = r is not None and (r >= target if kind == "min" else r <= target)
            verdict = "-" if r is None else f"NOT met ({', '.join(failed)})" if failed else "met" if ok else "NOT met"
        u = f" ({unit})" if unit else ""
        out.append([WORKLOAD_NAMES.get(mode, mode), label + u, fmt(ltb, unit), fmt(ws, unit),
                    f"{r:.2f}x" if r is not None else "-", text, verdict])
    return out


WS_HEAD = ["workload", "figure", "LTB members", "WebSocket members", "WebSocket / LTB", "target", "met?"]

HEAD = ["workload", "figure", "roomcastd", "C relay", "Redis", "/ C relay", "/ Redis", "target", "met?"]


def text_table(rs, head=HEAD):
    widths = [max(len(str(r[i])) for r in [head] + rs) for i in range(len(head))]
    numeric = range(2, len(head) - 2)
    line = lambda r: "  ".join(str(c).rjust(w) if i in numeric else str(c).ljust(w)
                               for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rs])


def markdown_table(rs, head=None):
    head = head or ["workload", "figure", "roomcastd", "C relay", "Redis", "roomcastd / C relay", "roomcastd / Redis",
                    "target (vs C relay; vs Redis or absolute)", "met?"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rs:
        out.append("| " + " | ".join(r) + " |")
    return "\n".join(out)


def main():
    args = sys.argv[1:]
    md = None
    if "--markdown" in args:
        i = args.index("--markdown")
        md = args[i + 1]
        del args[i:i + 2]
    machine, runs, ratios = load(args[0])
    rs = rows(runs, ratios)
    head = ""
    if machine:
        head = (f"{machine['nproc']} cores, {machine['cpu']}, kernel {machine['kernel']}, "
                f"Redis {machine.get('redis') or '-'}, commit {machine['commit']}, {machine['date']}, "
                f"load average at start {machine.get('loadavg', '?')}")
    n = max((d.get("repetitions", 1) for d in runs.values()), default=1)
    if n > 1:
        head += (f"; medians of {n} repetitions (values: median of each server's runs; "
                 f"ratios: median of the per-repetition ratios)")
    head += "; the C relay has no rooms and runs only the one-room workloads (fanout, pub10, large, latency)"
    ws = ws_rows(runs, ratios)
    print(head)
    print(text_table(rs))
    if ws:
        print("\nWebSocket members (roomcast.ltb.v1) beside LTB members of the same daemon, same repetitions:")
        print(text_table(ws, WS_HEAD))
    for n in notes(runs):
        print("note: " + n)
    if md:
        with open(md, "w") as f:
            f.write(head + "\n\n" + markdown_table(rs) + "\n")
            if ws:
                f.write("\nWebSocket members (`roomcast.ltb.v1`, one LTB frame per binary message) beside LTB "
                        "members of the same daemon, paired within each repetition:\n\n" + markdown_table(ws, WS_HEAD) + "\n")
            ns = notes(runs)
            if ns:
                f.write("\n" + "\n".join("- " + n for n in ns) + "\n")


if __name__ == "__main__":
    main()
