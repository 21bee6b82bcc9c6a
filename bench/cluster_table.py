#!/usr/bin/env python3
"""The tables of bench/cluster.sh (make bench-cluster).

    cluster_table.py RUN.jsonl [--markdown OUT.md]

Rows: each set-up (single, member, split) and workload (hot, perframe):
frames/s, deliveries/s, each process's CPU and its CPU per frame. Then the
derived costs (per delivery from `hot single`; Redis per frame on the
publishing daemon, on a receiving daemon and in redis-server from
`perframe`) and the projection to N daemons that BENCHMARKS.md discusses.
With several repetitions every value is the median. Standard library only.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from table import median, read_results  # noqa: E402  (beside this file)


def load(path):
    return read_results(path, lambda d: (d["setup"], d["workload"]))


def per_frame_us(cpu_pct, frames_per_s):
    return cpu_pct / 100 / frames_per_s * 1e6 if frames_per_s else float("nan")


def row(reps):
    """Medians of one set-up and loop: rates, CPU and CPU per frame per process."""
    out = {"n": len(reps)}
    out["frames_s"] = median([r["deliveries_per_s"] / r["members"] for r in reps])
    out["deliveries_s"] = median([r["deliveries_per_s"] for r in reps])
    out["p99_ms"] = median([r["lat_p99_us"] / 1000 for r in reps])
    out["loss"] = median([r["loss"] for r in reps])
    procs = {"A": "server_cpu_pct"}
    if reps[0]["setup"] == "member":
        procs["redis"] = "cpu_pid0_pct"
    if reps[0]["setup"] == "split":
        procs["B"] = "cpu_pid0_pct"
        procs["redis"] = "cpu_pid1_pct"
    procs["gen"] = "gen_cpu_pct"
    for name, key in procs.items():
        out[name + "_cpu"] = median([r.get(key, float("nan")) for r in reps])
        out[name + "_us"] = median([per_frame_us(r.get(key, float("nan")), r["deliveries_per_s"] / r["members"]) for r in reps])
    return out


def fmt(v, digits=0):
    if v is None or v != v:
        return "-"
    return f"{v:,.{digits}f}"


def main():
    args = sys.argv[1:]
    md_out = None
    if "--markdown" in args:
        i = args.index("--markdown")
        md_out = args[i + 1]
        del args[i:i + 2]
    machine, runs = load(args[0])
    rows = {k: row(v) for k, v in runs.items()}
    lines = []
    reps = max(r["n"] for r in rows.values())
    lines.append(f"{machine.get('nproc')} cores, {machine.get('cpu')}, kernel {machine.get('kernel')}, Redis {machine.get('redis')}, "
                 f"commit {machine.get('commit')}, {machine.get('date')}, load average at start {machine.get('loadavg')}; "
                 f"64 B opaque frames, 1 publisher on daemon A, members spread evenly, 1 seed client per daemon; medians of {reps} repetition(s)")
    lines.append("")
    lines.append("| workload | set-up | members | frames/s | deliveries/s | p99 (ms) | loss | daemon A CPU % | daemon B CPU % | redis CPU % "
                 "| generator CPU % | A µs/frame | B µs/frame | redis µs/frame | servers µs/frame |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for w in ("hot", "perframe"):
        for setup in ("single", "member", "split"):
            r = rows.get((setup, w))
            if not r:
                continue
            m = runs[(setup, w)][0]["members"]
            lines.append(f"| {w} | {setup} | {m:,} | {fmt(r['frames_s'])} | {fmt(r['deliveries_s'])} | {fmt(r['p99_ms'], 2)} | {fmt(r['loss'])} "
                         f"| {fmt(r.get('A_cpu'), 1)} | {fmt(r.get('B_cpu'), 1)} | {fmt(r.get('redis_cpu'), 1)} | {fmt(r.get('gen_cpu'), 1)} "
                         f"| {fmt(r.get('A_us'), 2)} | {fmt(r.get('B_us'), 2)} | {fmt(r.get('redis_us'), 2)} "
                         f"| {fmt(sum(r.get(k, 0) for k in ('A_us', 'B_us', 'redis_us')), 2)} |")

    hot = rows.get(("single", "hot"))
    single, member, split = (rows.get((s_, "perframe")) for s_ in ("single", "member", "split"))
    if hot and single and member and split:
        hot_members = runs[("single", "hot")][0]["members"]
        deliver_ns = hot["A_us"] * 1000 / (hot_members + 1)
        publishing = member["A_us"] - single["A_us"]               # PUBLISH + its own frame back, dropped
        receiving = split["B_us"] - split["A_us"] + publishing     # a frame from Redis instead of from a client
        redis_1, redis_2 = member["redis_us"], split["redis_us"]
        per_sub = max(redis_2 - redis_1, 0.0)
        redis_base = redis_1 - per_sub
        lines.append("")
        lines.append("Derived:")
        lines.append("")
        lines.append("| figure | from | value |")
        lines.append("|---|---|---|")
        lines.append(f"| daemon CPU per delivery in a hot room | hot single: A µs/frame / {hot_members + 1} | {fmt(deliver_ns, 1)} ns |")
        lines.append(f"| cluster cost per frame on the publishing daemon (PUBLISH, its own frame back) | perframe: member A - single A | {fmt(publishing, 2)} µs |")
        lines.append(f"| cluster cost per frame on a receiving daemon, beyond what a local frame costs | perframe split: B - A + the line above | {fmt(receiving, 2)} µs |")
        lines.append(f"| redis-server per frame, 1 daemon subscribed | perframe member | {fmt(redis_1, 2)} µs |")
        lines.append(f"| redis-server per frame, 2 daemons subscribed | perframe split | {fmt(redis_2, 2)} µs |")
        lines.append(f"| redis-server per frame per subscribed daemon | the difference | {fmt(per_sub, 2)} µs |")
        # A hot room of M members over N daemons, its publishers spread over
        # them too. A daemon, per frame of the room: its M/N deliveries, plus
        # (N-1)/N of the frames arriving from Redis rather than from a client,
        # plus 1/N of the frames published (and received back).
        lines.append("")
        lines.append("Projection: one hot room of M members over N daemons, a core each, and one core for Redis "
                     "(frames/s the room sustains and deliveries/s; N = 1 is one daemon without Redis):")
        lines.append("")
        lines.append("| members | daemons | daemon µs/frame | redis µs/frame | bound by | frames/s | deliveries/s |")
        lines.append("|---|---|---|---|---|---|---|")
        for m in (1000, 10000, 50000):
            for n in (1, 2, 4, 8, 16, 32):
                if n == 1:
                    d_us, r_us = m * deliver_ns / 1000, 0.0
                else:
                    d_us = (m / n) * deliver_ns / 1000 + (n - 1) / n * receiving + publishing / n
                    r_us = redis_base + n * per_sub
                cap_d = 1e6 / d_us
                cap_r = 1e6 / r_us if r_us > 0 else float("inf")
                fps = min(cap_d, cap_r)
                bound = "the daemons" if cap_d <= cap_r else "Redis"
                lines.append(f"| {m:,} | {n} | {fmt(d_us, 1)} | {fmt(r_us, 2) if n > 1 else '-'} | {bound} | {fmt(fps)} | {fmt(fps * m)} |")
    text = "\n".join(lines)
    print(text)
    if md_out:
        with open(md_out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
