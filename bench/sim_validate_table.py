#!/usr/bin/env python3
"""Table of bench/sim_validate.sh: simulated against measured exchange times.

Usage: sim_validate_table.py MEASURED.jsonl SIMULATED.jsonl

MEASURED: bench/slow_network.sh's --out lines of `dgc bench exchange` (one per run and link:
"profile", "workers", "algorithm", "dgc_seconds", "dense_seconds"). SIMULATED: bench/sim_scaling.sh's
lines of dgc-sim ("platform", "nodes", "algorithm", "exchange_s"). Several measured runs of the same
(link, ranks, algorithm) give their median; the dense allreduce of every run counts once.
Prints a Markdown table, milliseconds, with the error simulated / measured - 1 and the target
(dense within 15%, DGC exchanges within 25%).
"""
import json
import statistics
import sys

PLATFORM = {"1gbit": "ethernet-1g", "100mbit": "ethernet-100m"}
LINK = {"1gbit": "1 Gbit/s", "100mbit": "100 Mbit/s"}
ALGORITHMS = ["dense", "allgather", "direct", "sparse-allreduce"]
TARGET = {"dense": 0.15}


def lines(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.startswith("{")]
    except FileNotFoundError:
        return []


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    measured = {}
    for j in lines(sys.argv[1]):
        key = (j["profile"], j["workers"])
        measured.setdefault(key + (j["algorithm"],), []).append(j["dgc_seconds"])
        measured.setdefault(key + ("dense",), []).append(j["dense_seconds"])
    simulated = {}
    for j in lines(sys.argv[2]):
        simulated.setdefault((j["platform"], j["nodes"], j["algorithm"]), []).append(j["exchange_s"])

    print("| link | ranks | exchange | simulated ms | measured ms (runs) | error | within target? |")
    print("|---|---:|---|---:|---:|---:|---|")
    met = total = 0
    for profile in ["1gbit", "100mbit"]:
        ranks = sorted({k[1] for k in measured if k[0] == profile} |
                       {k[1] for k in simulated if k[0] == PLATFORM[profile]})
        for r in ranks:
            for a in ALGORITHMS:
                m = measured.get((profile, r, a))
                s = simulated.get((PLATFORM[profile], r, a))
                if not m and not s:
                    continue
                ms = f"{statistics.median(m) * 1e3:,.1f} ({len(m)})" if m else "-"
                ss = f"{statistics.median(s) * 1e3:,.1f}" if s else "-"
                err = verdict = "-"
                if m and s:
                    e = statistics.median(s) / statistics.median(m) - 1
                    limit = TARGET.get(a, 0.25)
                    err = f"{e * 100:+.1f}%"
                    ok = abs(e) <= limit
                    verdict = f"yes (±{limit * 100:.0f}%)" if ok else f"**no** (±{limit * 100:.0f}%)"
                    met += ok
                    total += 1
                print(f"| {LINK[profile]} | {r} | {a} | {ss} | {ms} | {err} | {verdict} |")
    print()
    print(f"within target: {met} of {total}")


if __name__ == "__main__":
    main()
