#!/usr/bin/env python3
"""The layers of src/ (docs/layout.md), from the imports: each top-level module and the ones
it names (`crate::x`), then the layers from the bottom up. Fails when two top-level modules
import each other through any chain, or when two files that are neither one the other's
module nor its parent's do (a circle such as limiter/hot.rs <-> limiter/in_flight.rs).

Usage: scripts/layers.py [SRC]   (default: the repository's src/)
"""
import re
import sys
from pathlib import Path

SRC = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "src")
PATH = re.compile(r"\b(crate|super)((?:::[a-z_][a-z0-9_]*)+)")
GROUP = re.compile(r"\buse\s+(crate|super)((?:::[a-z_][a-z0-9_]*)*)::\{([^{}]*)\}")


def module_of(path):
    """src/a/b.rs and src/a/b/mod.rs are ("a", "b"); src/lib.rs is ()."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] in ("mod", "lib"):
        parts.pop()
    return tuple(parts)


files = {module_of(f): f for f in sorted(SRC.rglob("*.rs"))}


def resolve(module, root, rest):
    """The file a path names: the longest module prefix of it. `super` is the parent of the
    file's own module (a mod.rs's module is its folder)."""
    base = () if root == "crate" else module[:-1]
    path = base + tuple(p for p in rest.split("::") if p)
    while path and path not in files:
        path = path[:-1]
    return path


def imports(module):
    text = re.sub(r"//[^\n]*", "", files[module].read_text())
    text = re.sub(r"#\[cfg\(test\)\]\s*mod tests\s*\{.*", "", text, flags=re.S)  # unit tests last
    found = set()
    for root, head, body in GROUP.findall(text):
        for item in body.split(","):
            item = item.strip().split(" as ")[0]
            if item and item != "self":
                found.add(resolve(module, root, f"{head}::{item}"))
            elif item == "self":
                found.add(resolve(module, root, head))
    for root, rest in PATH.findall(text):
        found.add(resolve(module, root, rest))
    return {f for f in found if f and f != module}


def circles(edges):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def related(a, b):
    """One is the other's module or an ancestor of it (a parent and its children share items)."""
    return a[: len(b)] == b or b[: len(a)] == a


file_edges = {m: {t for t in imports(m) if not related(m, t)} for m in files}
top_edges = {}
for m, targets in file_edges.items():
    if m:
        top_edges.setdefault(m[0], set()).update(t[0] for t in targets if t and t[0] != m[0])
for m in sorted(top_edges):
    print(f"{m:16} -> {', '.join(sorted(top_edges[m])) or '-'}")
loops = circles(top_edges) + circles(file_edges)
for loop in loops:
    print("loop:", " <-> ".join("/".join(x) if isinstance(x, tuple) else x for x in loop))
if loops:
    sys.exit(1)
placed, n = set(), 0
while len(placed) < len(top_edges):
    n += 1
    now = {m for m in top_edges if m not in placed and top_edges[m] <= placed}
    print(f"layer {n}: {', '.join(sorted(now))}")
    placed |= now
print("no loop")
