#!/usr/bin/env python3
"""Fails when a relative link or an anchor between the project's Markdown files does not
resolve: every `[text](path)` and `[text](path#anchor)` that is not a URL must name a file
that exists, and an anchor in a Markdown file must be one of its headings (GitHub's slugs).
Usage: python3 scripts/check_links.py [ROOT]"""
import re
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
skip = {"target", ".venv", "node_modules", ".git"}
link = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
fence = re.compile(r"^(```|~~~)")


def prose(text):
    """The lines outside fenced code blocks."""
    inside, lines = False, []
    for line in text.splitlines():
        if fence.match(line.strip()):
            inside = not inside
        elif not inside:
            lines.append(line)
    return lines


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found, seen = set(), {}
        for line in prose(path.read_text()):
            m = re.match(r"^#{1,6}\s+(.*)$", line)
            if m:
                base = slug(re.sub(r"`", "", m.group(1)))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


broken = []
files = [p for p in root.rglob("*.md") if not skip & set(p.relative_to(root).parts)]
for md in files:
    for line in prose(md.read_text()):
        for target in link.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md.resolve()
            if not dest.exists():
                broken.append(f"{md.relative_to(root)}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{md.relative_to(root)}: {target}: no such heading")
for b in broken:
    print(b)
print(f"{len(files)} Markdown files, {len(broken)} broken links")
sys.exit(1 if broken else 0)
