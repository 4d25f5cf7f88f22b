#!/usr/bin/env python3
"""Table of bench/sim_validate.sh: simulated against measured exchange times.

Usage: sim_validate_table.py SIMULATED.jsonl LABEL=MEASURED.jsonl [LABEL=MEASURED.jsonl ...]

SIMULATED: bench/sim_scaling.sh's lines of dgc-sim ("platform", "nodes", "algorithm",
"exchange_s"). Each MEASURED: bench/slow_network.sh's --out lines of `dgc bench exchange` (one per
run and link: "profile", "workers", "algorithm", "dgc_seconds", "dense_seconds"), one pair of
columns (measured, error) per file, headed by its LABEL. Several measured runs of the same (link,
ranks, algorithm) give their median; the dense allreduce of every run counts once. Prints a
Markdown table, milliseconds, with the error simulated / measured - 1 against the target (dense
within 15%, DGC exchanges within 25%: rows outside are marked **), and per column the count of
rows within target.
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


def measured_of(path):
    m = {}
    for j in lines(path):
        key = (j["profile"], j["workers"])
        m.setdefault(key + (j["algorithm"],), []).append(j["dgc_seconds"])
        m.setdefault(key + ("dense",), []).append(j["dense_seconds"])
    return m


def main():
    if len(sys.argv) < 3 or any("=" not in a for a in sys.argv[2:]):
        sys.exit(__doc__)
    simulated = {}
    for j in lines(sys.argv[1]):
        key = (j["platform"], j["nodes"], j["algorithm"])
        simulated.setdefault(key, []).append(j["exchange_s"])
    columns = [(a.split("=", 1)[0], measured_of(a.split("=", 1)[1])) for a in sys.argv[2:]]

    head = "| link | ranks | exchange | simulated ms |"
    rule = "|---|---:|---|---:|"
    for label, _ in columns:
        head += f" measured ms, {label} (runs) | error |"
        rule += "---:|---:|"
    print(head)
    print(rule)
    met = [0] * len(columns)
    total = [0] * len(columns)
    for profile in ["1gbit", "100mbit"]:
        ranks = {k[1] for k in simulated if k[0] == PLATFORM[profile]}
        for _, m in columns:
            ranks |= {k[1] for k in m if k[0] == profile}
        for r in sorted(ranks):
            for a in ALGORITHMS:
                s = simulated.get((PLATFORM[profile], r, a))
                row = f"| {LINK[profile]} | {r} | {a} | "
                row += f"{statistics.median(s) * 1e3:,.1f} |" if s else "- |"
                seen = bool(s)
                for c, (_, m) in enumerate(columns):
                    v = m.get((profile, r, a))
                    seen = seen or bool(v)
                    row += f" {statistics.median(v) * 1e3:,.1f} ({len(v)}) |" if v else " - |"
                    if v and s:
                        e = statistics.median(s) / statistics.median(v) - 1
                        ok = abs(e) <= TARGET.get(a, 0.25)
                        row += f" {e * 100:+.1f}% |" if ok else f" **{e * 100:+.1f}%** |"
                        met[c] += ok
                        total[c] += 1
                    else:
                        row += " - |"
                if seen:
                    print(row)
    print()
    print("within target (dense 15%, DGC 25%): " +
          ", ".join(f"{label} {met[c]} of {total[c]}" for c, (label, _) in enumerate(columns)))


if __name__ == "__main__":
    main()
