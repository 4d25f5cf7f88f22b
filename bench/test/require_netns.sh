# Sourced by the bench scripts' tests: exits 77 (ctest: skipped) with the reason unless this
# process can create network namespaces and shape links (root, iproute2, netns support).
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
