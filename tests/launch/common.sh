# Shared by the launch tests (sourced): a scratch directory, failure, a free port, and clean-up
# of every process the test started (each test runs its processes in this shell's process group
# and kills what is left on exit).
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 0.2
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${extra_cleanup:-}" ]; then eval "$extra_cleanup"; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 40 "$f"; } >&2; done
  exit 1
}

# A TCP port nobody listens on now (random in 20000..44999, checked with ss).
free_port() {
  local port
  for _ in $(seq 1 50); do
    port=$((20000 + RANDOM % 25000))
    if ! ss -Htln "sport = :$port" | grep -q .; then echo "$port"; return; fi
  done
  fail "no free port found"
}

# Milliseconds since the epoch.
now_ms() { date +%s%3N; }
