# Shell functions shared by the bench scripts that train and tabulate JSON lines. Sourced (not run)
# after the script has changed to the repository root: `source bench/lib.sh`.

# field NAME [OLDER_NAME] < jsonl: the value of NAME in each line, one per line (flat objects; no
# jq needed); in a line without NAME, OLDER_NAME's (a key renamed since: files written before the
# rename, kept by --skip-existing; docs/glossary.md, "Renamed").
field() {
  sed -E "${2:+/\"$1\":/!s/\"$2\":/\"$1\":/;}s/.*\"$1\":(\"?)([^,\"}]*)\1.*/\2/"
}

# kept_run JSONL N LABEL: succeeds, saying so, when the metrics file JSONL already holds at least N
# epochs (the run is finished; --skip-existing keeps it); fails otherwise.
kept_run() {
  local done_epochs
  done_epochs=$(grep -c '"epoch"' "$1" 2>/dev/null || true)
  [ "${done_epochs:-0}" -ge "$2" ] || return 1
  echo "== $3: kept ($1 has $done_epochs epochs)"
}
