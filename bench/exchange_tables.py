#!/usr/bin/env python3
"""Tables for docs/exchange-benchmark.md from `dgc bench exchange --json` lines.

  bench/exchange_tables.py runs FILE.jsonl     one row per run: times, phases, bytes
  bench/exchange_tables.py volume FILE.jsonl   bytes per worker by algorithm: measured at the
                                               world sizes in FILE (allgather and
                                               sparse-allreduce runs), computed for N = 16, 64,
                                               256 from the largest measured N (see the doc)
"""
import sys

import jsonl


# Keys renamed since (docs/glossary.md, "Renamed"): results written before read as well.
RENAMED = {"bytes_sent_per_rank": "wire_bytes_sent_per_rank",
           "bytes_received_per_rank": "wire_bytes_received_per_rank",
           "dense_bytes_per_rank": "dense_wire_bytes_per_rank"}


def load(path):
    return jsonl.load(path, RENAMED)


def runs(rows):
    print("| N | --exchange (ran) | exchange ms | encode | collective | validate | decode "
          "| dense allreduce ms | speedup | message B | wire sent B/rank | wire received B/rank "
          "| applied | returned/rank | bound ms | verified |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for j in rows:
        p = j["phases"]
        b = j.get("wire_bound_seconds")
        bound = "" if b is None else f"{1e3 * b:.2f}"
        print(f"| {j['workers']} | {j['exchange']} ({j['algorithm']}) | {1e3 * j['dgc_seconds']:.2f} "
              f"| {1e3 * p['encode_seconds']:.2f} | {1e3 * p['collective_seconds']:.2f} "
              f"| {1e3 * p['validate_seconds']:.2f} | {1e3 * p['decode_seconds']:.2f} "
              f"| {1e3 * j['dense_seconds']:.0f} | {j['speedup'] or 0:.1f}x | {j['message_bytes']} "
              f"| {j['wire_bytes_sent_per_rank']} | {j['wire_bytes_received_per_rank']} "
              f"| {j['applied_per_iteration']} | {j['returned_per_rank']} | {bound} "
              f"| {j['verified'] and j['dense_verified']} |")


def volume(rows):
    by = {(j["workers"], j["algorithm"]): j for j in rows if j["exchange"] == j["algorithm"]}
    sizes = sorted(n for (n, a) in by if a == "sparse-allreduce" and (n, "allgather") in by)
    top = sizes[-1]
    ag, sp = by[(top, "allgather")], by[(top, "sparse-allreduce")]
    k, a, m = sp["selected_per_rank"], sp["applied_per_iteration"], ag["message_bytes"]

    def overhead(n):  # per peer: two 32-byte headers and two 8-byte sizes
        return (n - 1) * (2 * 32 + 2 * 8)

    bpe = (sp["wire_bytes_received_per_rank"] - overhead(top)) / ((k + a) * (top - 1) / top)
    print(f"k = {k} selected per rank, a = {a} applied (N = {top}), message m = {m} B, "
          f"sparse-allreduce bytes per element = {bpe:.2f}")
    print("| N | allgather / direct: elements received per worker | bytes | sparse-allreduce: "
          "elements | bytes | sparse / allgather (bytes) | dense ring allreduce bytes | source |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    dense = ag["dense_gradient_bytes"]
    for n in sizes + [16, 64, 256]:
        if n in sizes:
            g, s = by[(n, "allgather")], by[(n, "sparse-allreduce")]
            gb, sb = g["wire_bytes_received_per_rank"], s["wire_bytes_received_per_rank"]
            ge = g["selected_per_rank"] * (n - 1)
            se = (s["selected_per_rank"] + s["applied_per_iteration"]) * (n - 1) / n
            src = "measured bytes; elements from the counts"
        else:
            ge, gb = k * (n - 1), (n - 1) * (m + 8)
            se = (k + a) * (n - 1) / n
            sb = bpe * se + overhead(n)
            src = f"computed from the N = {top} counts"
        print(f"| {n} | {ge:,.0f} ({ge / k:.2f}k) | {gb:,.0f} | {se:,.0f} ({se / k:.2f}k) "
              f"| {sb:,.0f} | {sb / gb:.3f} | {2 * (n - 1) * dense // n:,} | {src} |")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("runs", "volume"):
        sys.exit(__doc__)
    {"runs": runs, "volume": volume}[sys.argv[1]](load(sys.argv[2]))
