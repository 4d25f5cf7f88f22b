"""The table of bench/hooks.sh (and of slow_network.sh --bench command runs of the example):
one row per hook, ratios against the dense DDP row.

    hooks_table.py RESULTS.jsonl
"""

import sys

import jsonl

# Keys renamed since (docs/glossary.md, "Renamed"): results written before read as well.
RENAMED = {"bytes_per_step": "message_bytes_per_step",
           "bytes_per_step_post_warmup": "message_bytes_per_step_post_warmup"}


def load(path):
    return jsonl.load(path, RENAMED)


def main():
    rows = load(sys.argv[1])
    dense = next((r for r in rows if r["hook"] == "none"), None)
    print("| hook | test acc. | vs dense | bytes/step/worker (after warm-up) | bytes/step (whole run) "
          "| compression ratio (after warm-up) | time/step mean | overhead vs dense | time/step median "
          "| overhead vs dense (median) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        name = {"none": "dense DDP"}.get(r["hook"], r["hook"])
        delta = f"{100 * (r['test_accuracy'] - dense['test_accuracy']):+.2f}" if dense else "-"
        overhead = f"{1000 * (r['step_seconds'] - dense['step_seconds']):+.1f} ms" if dense else "-"
        median_overhead = (f"{1000 * (r['step_seconds_median'] - dense['step_seconds_median']):+.1f} ms"
                           if dense else "-")
        print(f"| {name} | {100 * r['test_accuracy']:.2f}% | {delta} | "
              f"{r['message_bytes_per_step_post_warmup']:,.0f} | {r['message_bytes_per_step']:,.0f} | "
              f"{r['compression_ratio_post_warmup']:.1f}x | {1000 * r['step_seconds']:.1f} ms | {overhead} | "
              f"{1000 * r['step_seconds_median']:.1f} ms | {median_overhead} |")
    dgc = next((r for r in rows if r["hook"] == "dgc"), None)
    psgd4 = next((r for r in rows if r["hook"] == "powersgd-rank4"), None)
    if dgc and psgd4:
        after = psgd4["message_bytes_per_step_post_warmup"] / dgc["message_bytes_per_step_post_warmup"]
        whole = psgd4["message_bytes_per_step"] / dgc["message_bytes_per_step"]
        print(f"\nDGC sends {after:.1f}x fewer bytes per step than PowerSGD rank 4 after warm-up "
              f"({whole:.1f}x over the whole run).")


if __name__ == "__main__":
    main()
