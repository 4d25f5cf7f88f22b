"""The table and charts of bench/accuracy_scale.sh: one row per run directory (OUT/wN, each with
dense.jsonl and dgc.jsonl of bench/accuracy.sh), written to OUT/scale.md; with gnuplot, the gap
chart OUT/scale-gap.png/.svg and the training loss against the step (not the epoch: more workers
means fewer steps per epoch) OUT/scale-loss-step.png/.svg, dense and DGC at each N.

Usage: accuracy_scale.py --out OUT DIR...
       accuracy_scale.py --compare CHART LABEL=OUT...   the gap charts of several sweeps in one
                                                         (CHART.png and CHART.svg)"""
import argparse
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jsonl import load  # noqa: E402

RENAMED = {"bytes_sent": "message_bytes", "dense_bytes": "dense_gradient_bytes"}
TARGET_POINTS = 0.5


def ratio(rows):
    sent = sum(r["message_bytes"] for r in rows)
    dense = sum(r["dense_gradient_bytes"] for r in rows)
    return dense / sent if sent else 0.0


def summary(directory):
    dense = load(os.path.join(directory, "dense.jsonl"), RENAMED)
    dgc = load(os.path.join(directory, "dgc.jsonl"), RENAMED)
    if not dense or not dgc:
        raise SystemExit(f"accuracy_scale.py: {directory} lacks a finished dense or DGC run")
    last = dgc[-1]
    # The ratio after warm-up as the run counted it (its last lines); without the log, from the
    # epochs after the first at the final density (that one may still hold warm-up steps).
    ratio_post = None
    log = os.path.join(directory, "dgc.log")
    if os.path.exists(log):
        found = re.findall(r"([0-9.]+)x after warm-up", open(log).read())
        ratio_post = float(found[-1]) if found else None
    if ratio_post is None:
        post = [r for r in dgc if r["density"] <= min(row["density"] for row in dgc)]
        ratio_post = ratio(post[1:] if len(post) > 1 else post)
    return {
        "workers": dgc[0]["workers"],
        "steps": sum(r["iterations"] for r in dgc),
        "dense": 100 * dense[-1]["test_accuracy"],
        "dgc": 100 * last["test_accuracy"],
        "ratio_post": ratio_post,
        "ratio_all": ratio(dgc),
        "age": last.get("residual_sent_age_mean"),
        "never": last.get("residual_never_sent_fraction"),
        "epochs": len(dgc),
        "curves": {
            name: [(sum(r["iterations"] for r in rows[: i + 1]), r["train_loss"])
                   for i, r in enumerate(rows)]
            for name, rows in (("dense", dense), ("dgc", dgc))
        },
    }


def compare(chart, series):
    """One gap chart from the scale-gap.dat files of several sweeps (LABEL=OUT each)."""
    plots = [f"{-TARGET_POINTS} with lines dashtype 2 lc rgb '#888888' title 'target: "
             f"-{TARGET_POINTS} points'", "0 with lines lc rgb '#cccccc' notitle"]
    workers = set()
    for item in series:
        label, out = item.split("=", 1)
        data = os.path.join(out, "scale-gap.dat")
        workers.update(int(line.split()[0]) for line in open(data) if line.strip())
        plots.append(f"'{data}' using 1:2 with linespoints lw 2 pt 7 title '{label}'")
    for terminal, ext in (("pngcairo size 800,500", "png"), ("svg size 800,500", "svg")):
        script = f"""
set terminal {terminal}
set output '{chart}.{ext}'
set title 'DGC - dense, final test accuracy, CNN, batch 32 per worker'
set xlabel 'workers'
set ylabel 'DGC - dense (points)'
set logscale x 2
set xtics ({', '.join(str(w) for w in sorted(workers))})
set grid
set key bottom left
plot {', '.join(plots)}
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("dirs", nargs="+")
    args = parser.parse_args()
    rows = sorted((summary(d) for d in args.dirs), key=lambda r: r["workers"])
    lines = [
        "| workers x batch | steps | dense | DGC | DGC - dense | ratio after warm-up | ratio over the run | mean age of a sent element, last epoch (steps) | elements never sent |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        age = f"{r['age']:.0f}" if r["age"] is not None else "-"
        never = f"{100 * r['never']:.1f}%" if r["never"] is not None else "-"
        lines.append(
            f"| {r['workers']} x 32 | {r['steps']:,} | {r['dense']:.2f}% | {r['dgc']:.2f}% | "
            f"{r['dgc'] - r['dense']:+.2f} | {r['ratio_post']:.1f}x | {r['ratio_all']:.1f}x | "
            f"{age} | {never} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "scale.md"), "w") as f:
        f.write(table)
    print(table, end="")

    data = os.path.join(args.out, "scale-gap.dat")
    with open(data, "w") as f:
        for r in rows:
            f.write(f"{r['workers']} {r['dgc'] - r['dense']:.4f} {r['dense']:.4f} {r['dgc']:.4f}\n")
    if shutil.which("gnuplot") is None:
        print("accuracy_scale.py: no chart (gnuplot not installed)", file=sys.stderr)
        return
    for terminal, ext in (("pngcairo size 800,500", "png"), ("svg size 800,500", "svg")):
        script = f"""
set terminal {terminal}
set output '{os.path.join(args.out, 'scale-gap.' + ext)}'
set title 'DGC - dense, final test accuracy, batch 32 per worker'
set xlabel 'workers'
set ylabel 'DGC - dense (points)'
set logscale x 2
set xtics ({', '.join(str(r['workers']) for r in rows)})
set grid
set key bottom left
plot {-TARGET_POINTS} with lines dashtype 2 lc rgb '#888888' title 'target: -{TARGET_POINTS} points', \\
     0 with lines lc rgb '#cccccc' notitle, \\
     '{data}' using 1:2 with linespoints lw 2 pt 7 title 'DGC - dense'
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)

    plots = []
    for i, r in enumerate(rows):
        for name, dash in (("dense", 2), ("dgc", 1)):
            path = os.path.join(args.out, f"scale-loss-w{r['workers']}-{name}.dat")
            with open(path, "w") as f:
                for step, loss in r["curves"][name]:
                    f.write(f"{step} {loss}\n")
            label = f"{r['workers']} x 32, {'dense' if name == 'dense' else 'DGC'}"
            plots.append(f"'{path}' using 1:2 with linespoints dashtype {dash} lc {i + 1} pt 7 "
                         f"ps 0.6 title '{label}'")
    for terminal, ext in (("pngcairo size 800,500", "png"), ("svg size 800,500", "svg")):
        script = f"""
set terminal {terminal}
set output '{os.path.join(args.out, 'scale-loss-step.' + ext)}'
set title 'Training loss (epoch mean) against steps, batch 32 per worker'
set xlabel 'steps'
set ylabel 'training loss'
set logscale x
set logscale y
set grid
set key top right
plot {', '.join(plots)}
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)


if __name__ == "__main__":
    main()
