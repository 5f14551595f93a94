#!/usr/bin/env python3
"""Checks the shape of the source tree: no import cycle between the files of a crate, and no
source file over the line limit. Exits 1 and lists what it found otherwise.

An edge a -> b means file a names an item of file b in a `use` (through `crate::`, `super::`
or a child module; re-exports are followed to the file that defines the item). Test modules
(`#[cfg(test)] mod tests { ... }` and files under `tests/`) are left out.

Usage: scripts/check-structure.py [--max-lines N] [CRATE_DIR ...]

Run by scripts/test.sh (so by CI) after `cargo fmt --check`.
"""
import os
import re
import sys

MAX_LINES = 800


def code_lines(path):
    """Lines that are neither blank nor only a comment."""
    n = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            s = line.strip()
            if s and not s.startswith("//"):
                n += 1
    return n


def module_of(root, path):
    rel = os.path.relpath(path, root)[:-3].split(os.sep)
    if rel[-1] in ("lib", "main", "mod"):
        rel = rel[:-1]
    return tuple(rel)


def use_paths(src):
    """Every path a file's `use` items name, as lists of segments, with `pub` re-exports
    marked."""
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{.*", "", src, flags=re.S)
    out = []
    for vis, body in re.findall(r"(?m)^\s*(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", src):
        body = re.sub(r"\s+", "", body)
        for path in expand(body):
            out.append((bool(vis), path))
    return out


def expand(body):
    """`a::{b,c::{d,e}}` -> [[a,b],[a,c,d],[a,c,e]] (aliases dropped)."""
    depth, start = 0, None
    for i, ch in enumerate(body):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                prefix = body[:start].rstrip(":")
                inner = body[start + 1 : i]
                parts, d, cur = [], 0, ""
                for c in inner:
                    if c == "," and d == 0:
                        parts.append(cur)
                        cur = ""
                        continue
                    d += c == "{"
                    d -= c == "}"
                    cur += c
                parts.append(cur)
                result = []
                for p in parts:
                    if not p:
                        continue
                    for tail in expand(p):
                        result.append(([prefix] if prefix else []) + tail)
                return [[seg for s in r for seg in s.split("::")] for r in result]
    return [re.sub(r"as\w+$", "", body).split("::")] if "as" not in body else [body.split("as")[0].split("::")]


def check_crate(crate):
    root = os.path.join(crate, "src")
    files = {}
    for d, _, names in os.walk(root):
        if "bin" in os.path.relpath(d, root).split(os.sep):
            continue
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(d, name)
                files[module_of(root, path)] = path
    uses = {m: use_paths(open(p, encoding="utf-8").read()) for m, p in files.items()}

    def absolute(m, path):
        path = [s for s in path if s not in ("self", "*", "")]
        if not path:
            return None
        here = list(m)
        if path[0] == "crate":
            return path[1:]
        if path[0] == "super":
            base = here
            while path and path[0] == "super":
                path = path[1:]
                base = base[:-1]
            return base + path
        if tuple(here + [path[0]]) in files:
            return here + path
        return None

    reexports = {m: {} for m in files}
    for m, items in uses.items():
        for public, path in items:
            target = absolute(m, path)
            if public and target:
                reexports[m][target[-1]] = target

    def resolve(parts, depth=0):
        for k in range(len(parts), -1, -1):
            mod = tuple(parts[:k])
            if mod in files:
                rest = parts[k:]
                if rest and rest[0] in reexports[mod] and depth < 8:
                    again = reexports[mod][rest[0]] + rest[1:]
                    if again != parts:
                        return resolve(again, depth + 1)
                return mod
        return None

    graph = {m: set() for m in files}
    for m, items in uses.items():
        for public, path in items:
            target = absolute(m, path)
            if target is None:
                continue
            t = resolve(target)
            # A file re-exporting a child's item is the child's door, not a dependency.
            if t is not None and t != m and not (public and t[: len(m)] == m):
                graph[m].add(t)
    return files, graph


def cycles(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def main(argv):
    limit = MAX_LINES
    if argv[:1] == ["--max-lines"]:
        limit = int(argv[1])
        argv = argv[2:]
    crates = argv or [
        os.path.dirname(p)
        for p in sorted(os.popen("git ls-files '*Cargo.toml'").read().split())
        if os.path.isdir(os.path.join(os.path.dirname(p) or ".", "src"))
    ]
    problems = []
    for crate in crates:
        files, graph = check_crate(crate or ".")
        for comp in cycles(graph):
            name = lambda m: "::".join(m) or "lib"
            edges = [
                f"{name(a)} -> {name(b)}" for a in comp for b in sorted(graph[a]) if b in comp
            ]
            problems.append(f"{crate}: import cycle between files: " + "; ".join(edges))
        for path in sorted(files.values()):
            n = code_lines(path)
            if n > limit:
                problems.append(f"{path}: {n} lines of code (limit {limit})")
    for d in ("tests", "benches", "examples", "src/bin"):
        for crate in crates:
            for base, _, names in os.walk(os.path.join(crate, d)):
                for name in names:
                    path = os.path.join(base, name)
                    if name.endswith(".rs") and code_lines(path) > limit:
                        problems.append(f"{path}: {code_lines(path)} lines of code (limit {limit})")
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"structure ok: {len(crates)} crates, no import cycle between files, no file over {limit} lines of code")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
