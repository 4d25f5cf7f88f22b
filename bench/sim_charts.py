#!/usr/bin/env python3
"""Tables and charts of the simulated cluster (dgc-sim JSON lines from bench/sim_scaling.sh).

  python3 bench/sim_charts.py RESULTS.jsonl [MORE.jsonl ...] [CHART_PREFIX]

Prints, as Markdown: per model and platform, the step time of dense and of DGC with each exchange
at every node count, the speedup over one node (N x the one-node dense step / the N-node step)
and the scaling efficiency (speedup / N) of the best; and where the step time goes at the largest
node count (a later file's line replaces an earlier one of the same model, platform, nodes and
algorithm). With CHART_PREFIX (and gnuplot), draws CHART_PREFIX-MODEL.png: speedup
against nodes, one panel per platform, dense beside one line per exchange algorithm.
"""
import json
import shutil
import subprocess
import sys

ALGORITHMS = ["dense", "allgather", "direct", "sparse-allreduce"]
PLATFORMS = ["ethernet-1g", "ethernet-10g", "ethernet-100m", "mobile"]
# Tables only: the rack platforms (16 hosts a rack, 2:1 oversubscribed uplinks). One node has no
# network, so where a rack platform has no one-node run its switch platform's stands in.
RACKS = {"racks-1g": "ethernet-1g", "racks-10g": "ethernet-10g"}


def load(paths):
    runs = {}
    for path in paths:
        for line in open(path):
            if line.startswith("{"):
                j = json.loads(line)
                runs[(j["model"], j["platform"], j["nodes"], j["algorithm"])] = j
    return runs


def speedups(runs, model, platform):
    """{algorithm: [(nodes, step, speedup)]} for one model and platform."""
    base = runs.get((model, platform, 1, "dense")) or runs.get(
        (model, RACKS.get(platform), 1, "dense"))
    if base is None:
        return {}
    out = {}
    for (m, p, n, a), j in sorted(runs.items(), key=lambda kv: kv[0][2]):
        if m == model and p == platform:
            out.setdefault(a, []).append((n, j["step_s"], n * base["step_s"] / j["step_s"]))
    return out


def tables(runs):
    models = sorted({k[0] for k in runs})
    for model in models:
        for platform in PLATFORMS + list(RACKS):
            s = speedups(runs, model, platform)
            if not s:
                continue
            nodes = sorted({n for a in s.values() for n, _, _ in a})
            print(f"\n**{model}, {platform}** (step seconds; speedup over one node in brackets)\n")
            print("| nodes | " + " | ".join(ALGORITHMS) + " | best | efficiency of the best |")
            print("|---:|" + "---:|" * len(ALGORITHMS) + "---|---:|")
            for n in nodes:
                cells, best = [], None
                for a in ALGORITHMS:
                    hit = [x for x in s.get(a, []) if x[0] == n]
                    if hit:
                        _, step, sp = hit[0]
                        cells.append(f"{step:.3f} ({sp:.1f}x)")
                        if best is None or step < best[1]:
                            best = (a, step, sp)
                    else:
                        cells.append("-")
                eff = f"{best[2] / n:.2f}" if best else "-"
                print(f"| {n} | " + " | ".join(cells) + f" | {best[0] if best else '-'} | {eff} |")


def breakdown(runs):
    print("\n**Where the step goes** (slowest rank's seconds per part; exchange = wire, waiting "
          "and the exchange's own CPU)\n")
    print("| model | platform | nodes | algorithm | compute | compress | exchange | update "
          "| step | received bytes per rank |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for (m, p, n, a), j in sorted(runs.items()):
        if n < 64 or p not in ("ethernet-1g", "ethernet-10g", *RACKS):
            continue
        print(f"| {m} | {p} | {n} | {a} | {j['compute_s']:.3f} | {j['compress_s']:.3f} | "
              f"{j['exchange_s']:.3f} | {j['update_s']:.3f} | "
              f"{j['step_s']:.3f} | {j['wire_received']:,} |")


def charts(runs, prefix):
    if shutil.which("gnuplot") is None:
        print("sim_charts.py: no charts (gnuplot not installed)", file=sys.stderr)
        return
    for model in sorted({k[0] for k in runs}):
        panels = []
        for platform in PLATFORMS:
            s = speedups(runs, model, platform)
            if not s:
                continue
            nmax = max(n for a in s.values() for n, _, _ in a)
            plots = [f"x with lines dashtype 2 lc rgb '#888888' title 'ideal'"]
            data = ""
            for a in ALGORITHMS:
                if a not in s:
                    continue
                plots.append(f"'-' using 1:2 with linespoints lw 2 pt 7 title '{a}'")
                data += "".join(f"{n} {sp}\n" for n, _, sp in s[a]) + "e\n"
            panels.append(f"""
set title '{model}, {platform}'
set xrange [1:{nmax}]
set yrange [0.25:{nmax}]
plot {', '.join(plots)}
{data}""")
        if not panels:
            continue
        for terminal, ext in (("pngcairo size 1000,800", "png"),):
            script = f"""
set terminal {terminal}
set output '{prefix}-{model}.{ext}'
set multiplot layout 2,2
set xlabel 'nodes'
set ylabel 'speedup over one node'
set logscale xy 2
set grid
set key top left
{''.join(panels)}
unset multiplot
"""
            subprocess.run(["gnuplot"], input=script, text=True, check=True)


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    files = [a for a in sys.argv[1:] if a.endswith(".jsonl")]
    prefixes = [a for a in sys.argv[1:] if not a.endswith(".jsonl")]
    runs = load(files)
    tables(runs)
    breakdown(runs)
    if prefixes:
        charts(runs, prefixes[-1])


if __name__ == "__main__":
    main()
