#!/usr/bin/env python3
"""Turns the JSON lines of one bench/run.sh run into the comparison table.

    table.py RUN.jsonl [--markdown OUT.md]

Each row is one figure of one workload: roomcastd, Redis, the ratio
roomcastd/Redis, and issue 5's target. With several repetitions (labels
rep-1, rep-2, ...), values are medians and the ratio is the median of the
ratios within each repetition. Standard library only.
"""
import json
import sys


def load(path):
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
                runs.setdefault((d["mode"], d["target"]), []).append(d)
    ratios = paired_ratios(runs)
    return machine, {k: median_run(v) for k, v in runs.items()}, ratios


def median(vals):
    vals = sorted(vals)
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def paired_ratios(runs):
    """{(mode, key): median over repetitions of roomcastd/Redis}, pairing the
    runs of one repetition (same label), which shared the machine's load."""
    out = {}
    for (mode, target), reps in runs.items():
        if target != "roomcast":
            continue
        redis = {r.get("label"): r for r in runs.get((mode, "redis"), [])}
        for key in reps[0]:
            rs = []
            for r in reps:
                o = redis.get(r.get("label"))
                a, b = r.get(key), (o or {}).get(key)
                if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and b:
                    rs.append(a / b)
            if rs:
                out[(mode, key)] = median(rs)
    return out


def median_run(reps):
    """One run whose numbers are the medians over repetitions (n = len(reps))."""
    if len(reps) == 1:
        reps[0]["repetitions"] = 1
        return reps[0]
    out = dict(reps[-1])
    for key, value in reps[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = median([r[key] for r in reps if isinstance(r.get(key), (int, float))])
        elif isinstance(value, bool):
            out[key] = all(r.get(key) for r in reps) if key.endswith("complete") else any(r.get(key) for r in reps)
    out["repetitions"] = len(reps)
    return out


# (workload, key, label, unit, better, target text, target check(ratio, roomcast value))
ROWS = [
    ("fanout", "deliveries_per_s", "deliveries/s", "", "higher", ">= 2x Redis", lambda r, v: r is not None and r >= 2),
    ("fanout", "deliveries_per_server_cpu_s", "deliveries per server CPU-s", "", "higher", "", None),
    ("fanout", "lat_p99_us", "latency p99", "ms", "lower", "", None),
    ("fanout", "server_cpu_pct", "server CPU", "%", "", "", None),
    ("fanout", "gen_cpu_pct", "generator CPU", "%", "", "", None),
    ("latency", "lat_p50_us", "latency p50", "ms", "lower", "", None),
    ("latency", "lat_p99_us", "latency p99", "ms", "lower", "<= 0.7x Redis", lambda r, v: r is not None and r <= 0.7),
    ("latency", "lat_max_us", "latency max", "ms", "lower", "", None),
    ("latency", "deliveries_per_s", "deliveries/s", "", "higher", "", None),
    ("latency", "server_cpu_pct", "server CPU", "%", "", "", None),
    ("latency", "gen_cpu_pct", "generator CPU", "%", "", "", None),
    ("large", "deliveries_per_s", "deliveries/s", "", "higher", ">= 1x Redis", lambda r, v: r is not None and r >= 1),
    ("large", "deliveries_per_server_cpu_s", "deliveries per server CPU-s", "", "higher", "", None),
    ("large", "mib_per_s", "body MiB/s", "", "higher", "", None),
    ("large", "lat_p99_us", "latency p99", "ms", "lower", "", None),
    ("large", "server_cpu_pct", "server CPU", "%", "", "", None),
    ("idle", "rss_per_conn_bytes", "RSS per connection", "B", "lower", "<= 1024 B", lambda r, v: v is not None and v <= 1024),
    ("idle", "server_cpu_pct", "server CPU, idle", "%", "lower", "< 2 %", lambda r, v: v is not None and v < 2),
    ("idle", "connect_s", "connect + join 19k", "s", "lower", "", None),
    ("storm", "storm_s", "10k connects: all joined", "s", "lower", "", None),
    ("storm", "storm_lat_p99_us", "probe p99 during storm", "ms", "lower", "< 50 ms", lambda r, v: v is not None and v < 50_000),
    ("storm", "storm_lat_max_us", "probe max during storm", "ms", "lower", "", None),
    ("storm", "storm_complete", "all accepted + joined", "", "", "yes", lambda r, v: v is True),
]


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
    if isinstance(v, float) and v >= 100 or isinstance(v, int):
        return f"{v:,.0f}"
    return f"{v:.1f}"


def rows(runs, ratios):
    out = []
    for mode, key, label, unit, _better, target, check in ROWS:
        rc = runs.get((mode, "roomcast"), {}).get(key)
        rd = runs.get((mode, "redis"), {}).get(key)
        if rc is None and rd is None:
            continue
        ratio = ratios.get((mode, key))
        met = ""
        if check is not None:
            met = "met" if check(ratio, rc) else ("-" if ratio is None and target.endswith("Redis") else "NOT met")
        u = f" ({unit})" if unit else ""
        out.append([mode, label + u, fmt(rc, unit), fmt(rd, unit), f"{ratio:.2f}x" if ratio is not None else "-", target, met])
    return out


def notes(runs):
    out = []
    for (mode, target), d in sorted(runs.items()):
        if d.get("gen_bound"):
            out.append(f"{mode}/{target}: the generator used {d['gen_cpu_pct']:.0f}% of its core: it may be the bottleneck")
        if d.get("loss"):
            out.append(f"{mode}/{target}: loss {d['loss']:,.0f} of {d['expected']:,.0f} deliveries")
        if d.get("closed_by_server"):
            out.append(f"{mode}/{target}: {d['closed_by_server']} connections closed by the server")
        if d.get("first_problem"):
            out.append(f"{mode}/{target}: {d['first_problem']}")
        if d.get("max_send_lag_us", 0) > 5000:
            turn = d.get("gen_max_turn_us")
            why = f"; its longest loop turn took {turn / 1000:.1f} ms" if turn is not None else ""
            out.append(f"{mode}/{target}: open-loop sends ran up to {d['max_send_lag_us'] / 1000:.1f} ms late "
                       f"(generator busy or preempted{why})")
    return out


HEAD = ["workload", "figure", "roomcastd", "Redis", "ratio", "issue 5 target", ""]


def text_table(rs):
    widths = [max(len(str(r[i])) for r in [HEAD] + rs) for i in range(len(HEAD))]
    line = lambda r: "  ".join(str(c).rjust(w) if 2 <= i <= 4 else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(HEAD), line(["-" * w for w in widths])] + [line(r) for r in rs])


def markdown_table(rs):
    out = ["| " + " | ".join(HEAD[:-1] + ["met?"]) + " |", "|" + "---|" * len(HEAD)]
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
                 f"ratio: median of the per-repetition ratios)")
    print(head)
    print(text_table(rs))
    for n in notes(runs):
        print("note: " + n)
    if md:
        with open(md, "w") as f:
            f.write(head + "\n\n" + markdown_table(rs) + "\n")
            ns = notes(runs)
            if ns:
                f.write("\n" + "\n".join("- " + n for n in ns) + "\n")


if __name__ == "__main__":
    main()
