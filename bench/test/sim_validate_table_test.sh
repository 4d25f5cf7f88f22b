#!/usr/bin/env bash
# bench/sim_validate_table.py on fixed lines: medians of repeated runs, the error of each row, the
# targets (dense 15%, DGC 25%), a row with only one side, and the count of rows within target.
set -euo pipefail
table=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/m.jsonl" <<'L'
{"profile":"1gbit","workers":2,"algorithm":"allgather","dgc_seconds":0.010,"dense_seconds":1.00}
{"profile":"1gbit","workers":2,"algorithm":"direct","dgc_seconds":0.020,"dense_seconds":1.20}
{"profile":"1gbit","workers":2,"algorithm":"sparse-allreduce","dgc_seconds":0.040,"dense_seconds":0.90}
{"profile":"100mbit","workers":4,"algorithm":"allgather","dgc_seconds":0.100,"dense_seconds":10.0}
L
cat >"$tmp/s.jsonl" <<'L'
{"platform":"ethernet-1g","nodes":2,"algorithm":"dense","exchange_s":1.10}
{"platform":"ethernet-1g","nodes":2,"algorithm":"allgather","exchange_s":0.012}
{"platform":"ethernet-1g","nodes":2,"algorithm":"direct","exchange_s":0.026}
{"platform":"ethernet-1g","nodes":2,"algorithm":"sparse-allreduce","exchange_s":0.031}
{"platform":"ethernet-100m","nodes":4,"algorithm":"dense","exchange_s":12.0}
L
cat >"$tmp/m2.jsonl" <<'L'
{"profile":"1gbit","workers":2,"algorithm":"allgather","dgc_seconds":0.0125,"dense_seconds":2.00}
L
out=$(python3 "$table" "$tmp/s.jsonl" "a=$tmp/m.jsonl" "b=$tmp/m2.jsonl")
echo "$out"
expect() {
  grep -qF -- "$1" <<<"$out" || { echo "sim_validate_table_test: missing: $1" >&2; exit 1; }
}
expect "| link | ranks | exchange | simulated ms | measured ms, a (runs) | error | measured ms, b (runs) | error |"
# Dense: the median of the three runs' 1.00, 1.20, 0.90 s is 1.00 s; simulated 1.10 s: +10%.
expect "| 1 Gbit/s | 2 | dense | 1,100.0 | 1,000.0 (3) | +10.0% | 2,000.0 (1) | **-45.0%** |"
expect "| 1 Gbit/s | 2 | allgather | 12.0 | 10.0 (1) | +20.0% | 12.5 (1) | -4.0% |"
expect "| 1 Gbit/s | 2 | direct | 26.0 | 20.0 (1) | **+30.0%** | - | - |"
expect "| 1 Gbit/s | 2 | sparse-allreduce | 31.0 | 40.0 (1) | -22.5% | - | - |"
expect "| 100 Mbit/s | 4 | dense | 12,000.0 | 10,000.0 (1) | **+20.0%** | - | - |"
expect "| 100 Mbit/s | 4 | allgather | - | 100.0 (1) | - | - | - |"
expect "within target (dense 15%, DGC 25%): a 3 of 5, b 1 of 2"
# A measured file without a label is refused.
if python3 "$table" "$tmp/s.jsonl" "$tmp/m.jsonl" >/dev/null 2>&1; then
  echo "sim_validate_table_test: an unlabelled measured file was accepted" >&2
  exit 1
fi
