"""Summarises the runs of bench/run: brokkr's ratios to each baseline, as a table and as JSON.

Each scenario ran ROUNDS times per target, alternating brokkr and the baseline; a target's figure
is the median over its rounds. Throughput is requests per second (lifecycles per second for the
lifecycle scenario); a throughput ratio above 1 favours brokkr, a p99 ratio below 1 does too.
The lifecycle is also given as a fraction of its floor: the lifecycles per second the clients
would complete if the broker cost nothing (clients ÷ (4 operations × the step's delay)).
"""

import argparse
import json
import statistics
from datetime import datetime, timezone


def rate(run):
    return run["lifecycles_per_second"] if run["scenario"] == "lifecycle" else run["requests_per_second"]


def summary(runs):
    return {
        "rounds": len(runs),
        "throughput": statistics.median(rate(r) for r in runs),
        "p50_ms": statistics.median(r["latency_ms"]["p50"] for r in runs),
        "p99_ms": statistics.median(r["latency_ms"]["p99"] for r in runs),
        "errors": sum(r["errors"] for r in runs),
    }


def main():
    ap = argparse.ArgumentParser()
    for name in ("mode", "runs", "memory", "machine", "command", "commit", "out", "floor"):
        ap.add_argument("--" + name, required=True)
    # With --postgres: what the two replicas left in their store (JSON, or null).
    ap.add_argument("--replica-checks", default="null")
    a = ap.parse_args()
    runs = [json.loads(line) for line in open(a.runs, encoding="utf-8") if line.strip()]
    by = {}
    for r in runs:
        by.setdefault((r["run"]["scenario"], r["target"]), []).append(r["run"])
    first = runs[0]["run"]
    results = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": a.command,
        "commit": a.commit,
        "machine": json.loads(a.machine),
        "concurrency": first["concurrency"],
        "seconds_per_run": round(first["seconds"], 1),
        "memory": json.loads(a.memory),
        "replica_checks": json.loads(a.replica_checks),
        "lifecycle_floor": float(a.floor),
        "lifecycle_of_floor": {},
        "summaries": {f"{s}/{t}": summary(rs) for (s, t), rs in by.items()},
        "comparisons": [],
        "targets": [],
        "runs": runs,
    }

    def compare(scenario, base, ref, label):
        if (scenario, base) not in by or (scenario, ref) not in by:
            return None
        b, r = summary(by[(scenario, base)]), summary(by[(scenario, ref)])
        c = {
            "scenario": scenario,
            "brokkr": base,
            "baseline": ref,
            "label": label,
            "throughput_ratio": b["throughput"] / r["throughput"] if r["throughput"] else None,
            "p50_ratio": b["p50_ms"] / r["p50_ms"] if r["p50_ms"] else None,
            "p99_ratio": b["p99_ms"] / r["p99_ms"] if r["p99_ms"] else None,
            "brokkr_summary": b,
            "baseline_summary": r,
        }
        results["comparisons"].append(c)
        return c

    def target(name, value, limit, higher_is_better):
        if value is None:
            return
        met = value >= limit if higher_is_better else value <= limit
        results["targets"].append({"target": name, "value": round(value, 3), "limit": limit, "met": met})

    if a.mode == "baselines":
        cat_o = compare("catalog", "brokkr", "openbrokerapi", "catalog vs openbrokerapi")
        cat_s = compare("catalog", "brokkr", "static", "catalog vs static handler")
        compare("poll", "brokkr", "openbrokerapi", "poll vs openbrokerapi")
        life = compare("lifecycle", "brokkr", "openbrokerapi", "lifecycle vs openbrokerapi")
        pg_o = compare("lifecycle", "brokkr-postgres", "openbrokerapi", "lifecycle (PostgreSQL) vs oba")
        pg_s = compare("lifecycle", "brokkr-postgres", "brokkr", "lifecycle PostgreSQL vs SQLite")
        two_o = compare("lifecycle", "brokkr-pg-2x", "openbrokerapi", "lifecycle (PG, 2 replicas) vs oba")
        two_one = compare("lifecycle", "brokkr-pg-2x", "brokkr-postgres", "lifecycle PG 2 replicas vs 1")
        compare("lifecycle", "brokkr-pg-2x-affinity", "brokkr-postgres",
                "lifecycle PG 2 replicas, affinity, vs 1")
        compare("lifecycle", "brokkr", "brokkr-before", "lifecycle vs brokkr before")
        floor = float(a.floor)
        for t in ("brokkr", "brokkr-postgres", "brokkr-pg-2x", "brokkr-pg-2x-affinity", "brokkr-before",
                  "openbrokerapi"):
            if ("lifecycle", t) in by:
                share = summary(by[("lifecycle", t)])["throughput"] / floor
                results["lifecycle_of_floor"][t] = round(share, 3)
        if cat_o:
            target("catalog throughput ≥ 20× openbrokerapi", cat_o["throughput_ratio"], 20, True)
        if cat_s:
            target("catalog throughput ≥ 0.7× static handler", cat_s["throughput_ratio"], 0.7, True)
        if life:
            target("lifecycle throughput ≥ 3× openbrokerapi", life["throughput_ratio"], 3, True)
            target("lifecycle p99 ≤ 0.7× openbrokerapi's", life["p99_ratio"], 0.7, False)
            target("lifecycle throughput ≥ 50% of the floor",
                   results["lifecycle_of_floor"]["brokkr"], 0.5, True)
        if pg_o:
            target("lifecycle on PostgreSQL ≥ 4× openbrokerapi", pg_o["throughput_ratio"], 4, True)
            target("lifecycle p99 on PostgreSQL ≤ 0.3× openbrokerapi's", pg_o["p99_ratio"], 0.3, False)
        if pg_s:
            target("lifecycle on PostgreSQL ≥ 60% of SQLite's", pg_s["throughput_ratio"], 0.6, True)
        if two_o:
            target("lifecycle on 2 PostgreSQL replicas ≥ 4× openbrokerapi", two_o["throughput_ratio"], 4, True)
        if two_one:
            target("lifecycle on 2 PostgreSQL replicas ≥ 1× one", two_one["throughput_ratio"], 1, True)
        checks = results["replica_checks"]
        if checks:
            for name in ("in_progress", "resumed", "steps_started_twice"):
                target(f"2 replicas: {name.replace('_', ' ')} = 0 (of {checks['operations']} operations)",
                       checks[name], 0, False)
    else:
        large = next(t for (_, t) in by if t != "1k")
        c = compare("poll", large, "1k", f"poll at {large} vs 1k instances")
        if c:
            target(f"poll p50 at {large} ≤ 1.2× at 1k", c["p50_ratio"], 1.2, False)
            target(f"poll p99 at {large} ≤ 1.2× at 1k", c["p99_ratio"], 1.2, False)
        mem = results["memory"]["large"]
        target(f"brokkr RSS at {large} instances ≤ 64 MB", mem["rss_mb"], 64, False)
        target(f"brokkr peak RSS (VmHWM) at {large} instances ≤ 64 MB", mem["hwm_mb"], 64, False)

    print()
    print(f"{'comparison':<40} {'brokkr':>12} {'baseline':>12} {'ratio':>7}   {'p99 brokkr':>10} {'p99 base':>9} {'ratio':>6}  errors")
    for c in results["comparisons"]:
        b, r = c["brokkr_summary"], c["baseline_summary"]
        unit = "lc/s" if c["scenario"] == "lifecycle" else "req/s"
        print(
            f"{c['label']:<40} {b['throughput']:>7.0f} {unit:<4} {r['throughput']:>7.0f} {unit:<4}"
            f" {c['throughput_ratio']:>6.2f}×   {b['p99_ms']:>7.2f} ms {r['p99_ms']:>6.2f} ms {c['p99_ratio']:>5.2f}×"
            f"  {b['errors']}/{r['errors']}"
        )
    for t, share in results["lifecycle_of_floor"].items():
        print(f"lifecycle {t}: {share:.1%} of the floor ({float(a.floor):.0f} lc/s)")
    print()
    for t in results["targets"]:
        print(f"{'met   ' if t['met'] else 'MISSED'} {t['target']}: {t['value']}")
    print(f"memory: {json.dumps(results['memory'])}")
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    print()
    print(json.dumps({k: results[k] for k in ("command", "commit", "machine", "memory", "targets",
                                              "lifecycle_of_floor")}
                     | {"comparisons": [{k: c[k] for k in ("label", "throughput_ratio", "p50_ratio", "p99_ratio")}
                                         for c in results["comparisons"]]}, indent=1))
    print(f"(full results in {a.out})")


main()
