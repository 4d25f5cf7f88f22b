# Sourced by the bench scripts' tests: exits 77 (ctest: skipped) with the reason unless this
# process can create network namespaces and shape links (root, iproute2, netns support); then
# defines the checks those tests share.
if [ "$(id -u)" -ne 0 ]; then
  echo "skipped: needs root for network namespaces"
  exit 77
fi
if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "skipped: needs iproute2 (ip, tc)"
  exit 77
fi
probe="dgcbenchprobe$$"
if ! ip netns add "$probe" 2>/dev/null; then
  echo "skipped: cannot create network namespaces here"
  exit 77
fi
ip netns delete "$probe"

# expect_charts DIR NAME...: every NAME.png and NAME.svg in DIR is a non-empty file.
expect_charts() {
  local dir="$1" chart ext
  shift
  for chart in "$@"; do
    for ext in png svg; do
      [ -s "$dir/$chart.$ext" ] || { echo "FAIL: $chart.$ext missing"; exit 1; }
    done
  done
}

# expect_namespaces_removed LOG: the namespaces slow_network.sh named in LOG are gone.
expect_namespaces_removed() {
  local tags tag
  tags="$(sed -nE 's/^slow_network: namespaces (dgcbench[0-9]+)br .*/\1/p' "$1")"
  [ -n "$tags" ] || { echo "FAIL: the script did not name its namespaces"; exit 1; }
  for tag in $tags; do
    if ip netns list | grep -q "^$tag"; then
      echo "FAIL: namespaces $tag* left behind:"; ip netns list; exit 1
    fi
  done
}
