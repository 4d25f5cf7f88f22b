#!/usr/bin/env python3
"""The verdict of bench/soak.sh on a finished soak's files: OUT/soak.jsonl (the --metrics lines)
and OUT/rss.tsv (seconds, epochs done, VmRSS kB, VmHWM kB, one line a second). Writes OUT/soak.md
and exits 0 when neither the resident memory nor the time per step grew from the first epochs
at the final density to the last five (2% + 8 MB, 25%), 1 when one did (its row says GREW),
2 when the files allow no verdict.

    soak_judge.py OUT EPOCHS LOAD_START LOAD_END
"""
import json
import statistics
import sys


def die(message):
    print(message, file=sys.stderr)
    sys.exit(2)  # not a verdict: the files do not allow one


out, epochs, load_start, load_end = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
metrics = [json.loads(line) for line in open(f"{out}/soak.jsonl") if line.startswith("{")]
if len(metrics) != epochs:
    die(f"soak: {len(metrics)} metrics lines for {epochs} epochs")
samples = [line.split("\t") for line in open(f"{out}/rss.tsv")]
samples = [(int(s), int(e), int(r), int(h)) for s, e, r, h in samples]
warm = 2  # the density warm-up (1 epoch) and the first epoch at d: allocations settle there


def rss_during(epoch_range):
    values = [r for _, e, r, _ in samples if e in epoch_range]
    return statistics.median(values) if values else None


start_epochs = range(warm, warm + 5)
end_epochs = range(epochs - 5, epochs)
rss_start = rss_during(start_epochs)
rss_end = rss_during(end_epochs)
peak = max(h for *_, h in samples)
step = [m["train_seconds"] / m["iterations"] for m in metrics]
step_start = statistics.median(step[warm : warm + 5])
step_end = statistics.median(step[-5:])
steps = sum(m["iterations"] for m in metrics)
if rss_start is None or rss_end is None:
    die("soak: no memory samples at the start or the end; the run was too short")
rss_ok = rss_end <= rss_start * 1.02 + 8 * 1024
step_ok = step_end <= step_start * 1.25
rows = [
    ("steps (DGC, all workers in step)", f"{steps:,}", ""),
    ("resident memory, epochs %d-%d (median of 1 s samples)" % (start_epochs[0] + 1, start_epochs[-1] + 1),
     f"{rss_start / 1024:.1f} MB", ""),
    ("resident memory, epochs %d-%d" % (end_epochs[0] + 1, end_epochs[-1] + 1), f"{rss_end / 1024:.1f} MB",
     "ok" if rss_ok else "GREW"),
    ("peak resident memory (VmHWM)", f"{peak / 1024:.1f} MB", ""),
    ("time per step, epochs %d-%d (median)" % (start_epochs[0] + 1, start_epochs[-1] + 1),
     f"{1e3 * step_start:.1f} ms", ""),
    ("time per step, epochs %d-%d (median)" % (end_epochs[0] + 1, end_epochs[-1] + 1), f"{1e3 * step_end:.1f} ms",
     "ok" if step_ok else "GREW"),
    ("final test accuracy", f"{100 * metrics[-1]['test_accuracy']:.2f}%", ""),
    ("compression ratio, last epoch", f"{metrics[-1]['compression_ratio']:.1f}x", ""),
    ("load average (1, 5, 15 min) at start / end", f"{load_start} / {load_end}", ""),
]
with open(f"{out}/soak.md", "w") as f:
    f.write("| | value | |\n|---|---:|---|\n")
    for name, value, verdict in rows:
        f.write(f"| {name} | {value} | {verdict} |\n")
print(open(f"{out}/soak.md").read(), end="")
sys.exit(0 if rss_ok and step_ok else 1)
