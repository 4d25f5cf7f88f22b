"""Reads the JSON lines the benchmarks and `dgc train --metrics` write, for the table scripts in
this folder (imported as `from jsonl import load`)."""
import json


def load(path, renamed=None):
    """The JSON objects of `path`, one per line starting with '{'. `renamed` maps keys renamed
    since (docs/glossary.md, "Renamed") to their new names, so that results written before read
    as well."""
    rows = [json.loads(line) for line in open(path) if line.startswith("{")]
    for row in rows:
        for old, new in (renamed or {}).items():
            if old in row and new not in row:
                row[new] = row.pop(old)
    return rows
