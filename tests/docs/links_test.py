#!/usr/bin/env python3
"""Every relative link in README.md and docs/**/*.md must lead somewhere.

    tests/docs/links_test.py [REPOSITORY_ROOT]

A link `[text](path)`, `![alt](path)`, `[id]: path`, `<img src="path">` or `<a href="path">`
whose path is relative (no scheme such as https:) must name a file or folder that exists,
relative to the Markdown file that holds it. A `#anchor`, alone or after a path to a Markdown
file, must be the anchor of a heading of that file by GitHub's rule: the heading's text in
lower case, every character that is not a letter, a digit, a space, '-' or '_' dropped, each
space made a '-'; the second heading with the same anchor gets '-1', the third '-2'. Code (fenced
blocks and `spans`) holds no links and no headings. Prints each broken link as
`file:line: target: what is wrong` and exits 1 if there is one, 0 otherwise.
"""

import os
import re
import sys

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_LINK = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)\s*=\s*\"([^\"]*)\"", re.IGNORECASE)
HTML_ANCHOR = re.compile(r"<a\b[^>]*?\b(?:name|id)\s*=\s*\"([^\"]*)\"", re.IGNORECASE)
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def lines_outside_code(text):
    """(line number, line) for every line outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.split("\n"), start=1):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group(1)
                continue
            yield number, line
        elif match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence) \
                and line.strip() == match.group(1):
            fence = None


def heading_text(raw):
    """The text a heading renders: link texts kept, code spans' contents kept, markup dropped."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", raw)
    text = CODE_SPAN.sub(lambda m: m.group(2), text)
    return re.sub(r"<[^>]+>", "", text)


def slug(text):
    kept = "".join(c for c in heading_text(text).lower()
                   if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def anchors_of(path, cache={}):
    if path not in cache:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        anchors, seen = set(), {}
        for _, line in lines_outside_code(text):
            match = HEADING.match(line)
            if match:
                base = slug(match.group(2))
                count = seen.get(base, 0)
                seen[base] = count + 1
                anchors.add(base if count == 0 else f"{base}-{count}")
            for name in HTML_ANCHOR.findall(line):
                anchors.add(name)
        cache[path] = anchors
    return cache[path]


def links_of(path):
    """(line number, target) of every link in the file, code left out."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for number, line in lines_outside_code(text):
        prose = CODE_SPAN.sub("", line)
        for target in INLINE_LINK.findall(prose):
            yield number, target
        match = REFERENCE_DEFINITION.match(prose)
        if match:
            yield number, match.group(1)
        for target in HTML_LINK.findall(prose):
            yield number, target


def problem(source, target, root):
    """What is wrong with `target` as a link in `source`, or None."""
    if not target or SCHEME.match(target):
        return None
    path, _, anchor = target.partition("#")
    if path.startswith("/"):
        resolved = os.path.normpath(os.path.join(root, path.lstrip("/")))
    elif path:
        resolved = os.path.normpath(os.path.join(os.path.dirname(source), path))
    else:
        resolved = source
    if not os.path.exists(resolved):
        return f"no such file: {os.path.relpath(resolved, root)}"
    if anchor:
        if not resolved.endswith(".md") or not os.path.isfile(resolved):
            return f"an anchor on a file that is not Markdown: {os.path.relpath(resolved, root)}"
        if anchor not in anchors_of(resolved):
            return f"no heading with the anchor #{anchor} in {os.path.relpath(resolved, root)}"
    return None


def markdown_files(root):
    files = [os.path.join(root, "README.md")]
    for folder, subfolders, names in os.walk(os.path.join(root, "docs")):
        subfolders.sort()
        files += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".md")]
    return [f for f in files if os.path.isfile(f)]


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    files = markdown_files(root)
    broken = checked = 0
    for source in files:
        for number, target in links_of(source):
            checked += 1
            what = problem(source, target, root)
            if what:
                broken += 1
                print(f"{os.path.relpath(source, root)}:{number}: {target}: {what}")
    if broken:
        print(f"links: {broken} of {checked} links in {len(files)} files are broken: fix the path "
              "or the anchor (a heading's anchor: lower case, punctuation other than - and _ "
              "dropped, spaces as -)")
        return 1
    print(f"links: all {checked} links in {len(files)} files resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
