# Sourced by the scripts that run the sanitizer builds (scripts/test_reliability.sh,
# scripts/sanitizers/killed_peer_loop.sh): the options for every process the tests start,
# workers included. Suppressions: only the files named here, each entry with its reason.
sanitizers_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$sanitizers_dir/tsan.supp"
