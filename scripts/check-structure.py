#!/usr/bin/env python3
"""Checks the shape of the source tree: no import cycle between the files of a crate or of a
Python package, and no source file (Rust or Python) over the line limit. Exits 1 and lists
what it found otherwise.

An edge a -> b means file a names an item of file b, either in a `use` or inline in code
(`crate::x::Y`, `$crate::x::Y`, `super::x::Y`, `self::m::Y`, or `m::Y` where `m` is a child
module of a); re-exports are followed to the file that defines the item. Comments (doc
comments included, so doc links do not count), string and character literals and attributes
are left out, and so is test code: items under `#[cfg(test)]` (`mod tests { ... }`, a
`#[cfg(test)] mod tests;` file, a test-only `use` or `fn`) and files under `tests/`.

Each cycle is printed with its files, a shortest cycle through them, and every line that
makes one of its edges (file:line and the path named there): removing all the lines of one
edge of the shortest cycle breaks it.

Python: each package tracked by git (a folder with an `__init__.py` whose parent has none)
gets the same rule, an edge a -> b meaning module a imports module b (or an item of it) when
it loads: imports at the top level and in top-level `if`/`try` blocks, not those inside
functions (they run once every module has loaded) or under `if TYPE_CHECKING:`. A package
importing its own submodules is their door, not a dependency (as a Rust file re-exporting a
child's item). Every tracked `.py` file is held to the line limit.

Usage: scripts/check-structure.py [--max-lines N] [CRATE_DIR ...]
       scripts/check-structure.py --self-test

Run by scripts/test.sh (so by CI) after `cargo fmt --check`.
"""
import ast
import bisect
import os
import re
import sys
import tempfile
from collections import deque

MAX_LINES = 800


def code_lines(path):
    """Lines that are neither blank nor only a comment (`//` in Rust, `#` in Python)."""
    comment = "#" if path.endswith(".py") else "//"
    n = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            s = line.strip()
            if s and not s.startswith(comment):
                n += 1
    return n


def module_of(root, path):
    rel = os.path.relpath(path, root)[:-3].split(os.sep)
    if rel[-1] in ("lib", "main", "mod"):
        rel = rel[:-1]
    return tuple(rel)


# ---------------------------------------------------------------------------------------------
# Reading a file: what is code, and which paths the code names.


def blank(text, start, end):
    """`text` with `start..end` replaced by spaces, its newlines kept (so offsets and line
    numbers stay what they were)."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def strip_literals(src):
    """The source with comments (line, block, doc), string literals (plain, byte, C, raw) and
    character literals blanked; lifetimes and labels are kept."""
    out = list(src)
    i, n = 0, len(src)

    def wipe(a, b):
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif c == "r" and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")) and re.match(
            r'r#*"', src[i:]
        ) or (c == "b" and src.startswith("br", i) and re.match(r'br#*"', src[i:])):
            m = re.match(r'b?r(#*)"', src[i:])
            end = src.find('"' + m.group(1), i + m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            wipe(i, j)
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            wipe(i, j + 1)
            i = j + 1
        elif c == "'":
            # A character literal ('x', '\n', '\u{1F600}', '"'), or a lifetime/label ('a).
            if i + 1 < n and src[i + 1] == "\\":
                j = src.find("'", i + 3)
                j = n if j < 0 else j + 1
                wipe(i, j)
                i = j
            elif i + 2 < n and src[i + 2] == "'":
                wipe(i, i + 3)
                i += 3
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


CLOSE = {"(": ")", "[": "]", "{": "}"}


def matching(text, i):
    """The offset just after the bracket that closes the one at `text[i]`."""
    stack = [CLOSE[text[i]]]
    j = i + 1
    while j < len(text) and stack:
        c = text[j]
        if c in CLOSE:
            stack.append(CLOSE[c])
        elif c in ")]}":
            stack.pop()
        j += 1
    return j


def item_end(text, i):
    """Where the item starting at `i` ends: its `;`, or the brace that closes its body (the
    first `{` outside parentheses and brackets)."""
    j = i
    while j < len(text):
        c = text[j]
        if c in "([":
            j = matching(text, j)
            continue
        if c == ";":
            return j + 1
        if c == "{":
            return matching(text, j)
        j += 1
    return j


ATTRS = r"(?:#!?\[[^\]]*\]\s*)*"
VIS = r"(?:pub(?:\s*\([^)]*\))?\s+)?"
TEST_ITEM = re.compile(
    r"#\[cfg\(test\)\]\s*" + ATTRS + VIS
    + r"(?:(?:async|const|unsafe|extern(?:\s+\"C\")?)\s+)*"
    + r"(mod|use|fn|impl|struct|enum|trait|const|static|type)\b"
)


def drop_test_code(text):
    """`text` with `#[cfg(test)]` items blanked, and the names of the `#[cfg(test)] mod x;`
    files it declares (test modules kept in their own file)."""
    test_files = set()
    while True:
        m = TEST_ITEM.search(text)
        if not m:
            return text, test_files
        decl = re.match(r"mod\s+(\w+)\s*;", text[m.start(1):])
        if decl:
            test_files.add(decl.group(1))
        text = blank(text, m.start(), item_end(text, m.start(1)))


def drop_attributes(text):
    """`text` with every attribute (`#[...]`, `#![...]`) blanked: nothing in one names an
    item of the same crate that the code depends on."""
    for m in reversed(list(re.finditer(r"#!?\[", text))):
        text = blank(text, m.start(), matching(text, m.end() - 1))
    return text


def inline_modules(text):
    """`(start, end, name)` of each inline `mod name { ... }` (paths inside are relative to
    it)."""
    return [
        (m.start(), matching(text, m.end() - 1), m.group(1))
        for m in re.finditer(r"(?<![\w$])mod\s+(\w+)\s*\{", text)
    ]


def use_tree(body, offset):
    """The leaves of a `use` tree: `a::{b, c::{d as e, self}}` -> ([a, b], pos), ([a, c, d],
    pos), ([a, c, self], pos), each with the offset of its last segment."""
    tokens = [(m.group(), offset + m.start()) for m in re.finditer(r"::|[{},*]|\$?\w+", body)]
    leaves = []

    def tree(k, prefix):
        segs, pos = list(prefix), None
        while k < len(tokens):
            t, at = tokens[k]
            if t == "{":
                k += 1
                while k < len(tokens) and tokens[k][0] != "}":
                    if tokens[k][0] == ",":
                        k += 1
                        continue
                    k = tree(k, segs)
                return k + 1
            if t in (",", "}"):
                break
            if t == "as":
                k += 2
                continue
            if t != "::":
                segs.append(t)
                pos = at
            k += 1
        if pos is not None:
            leaves.append((segs, pos))
        return k

    tree(0, [])
    return leaves


class Source:
    """What one file names: `uses` as (public, segments, offset, shown) and `inline` paths as
    (segments, offset, shown), with the inline module each is in ([`scope`](Source.scope))."""

    def __init__(self, src):
        text, self.test_files = drop_test_code(strip_literals(src))
        text = drop_attributes(text)
        self.lines = [m.start() for m in re.finditer("\n", src)]
        self.modules = inline_modules(text)
        self.uses = []
        for m in re.finditer(r"(?<![\w$])(pub(?:\s*\([^)]*\))?\s+)?use\s+([^;]+);", text):
            for segs, pos in use_tree(m.group(2), m.start(2)):
                shown = "use " + "::".join(s for s in segs)
                self.uses.append((bool(m.group(1)), segs, pos, shown))
            text = blank(text, m.start(), m.end())
        # `pub(in crate::a)` restricts who sees an item; it depends on nothing.
        text = re.sub(r"pub\s*\(\s*in\s[^)]*\)", lambda m: " " * len(m.group()), text)
        self.inline = []
        path = re.compile(r"(?<![\w$])(?<!::)(\$crate|[A-Za-z_]\w*)((?:\s*::\s*[A-Za-z_]\w*)+)")
        for m in path.finditer(text):
            segs = [m.group(1).lstrip("$")] + re.findall(r"\w+", m.group(2))
            self.inline.append((segs, m.start(), re.sub(r"\s+", "", m.group())))

    def line(self, offset):
        return bisect.bisect_left(self.lines, offset) + 1

    def scope(self, offset):
        """The inline modules around `offset`, outermost first."""
        return [name for start, end, name in self.modules if start < offset < end]


# ---------------------------------------------------------------------------------------------
# A crate's file graph.


def crate_files(root):
    """Every `.rs` file of `src/` outside `src/bin`, by module path."""
    files = {}
    for d, _, names in os.walk(root):
        if "bin" in os.path.relpath(d, root).split(os.sep):
            continue
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(d, name)
                files[module_of(root, path)] = path
    return files


def check_crate(crate):
    """The crate's files (module path -> file), and its graph: for each file, the files it
    names, each with the lines that name it as (line, shown path)."""
    root = os.path.join(crate, "src")
    files = crate_files(root)
    sources = {}
    for m, p in files.items():
        with open(p, encoding="utf-8") as f:
            sources[m] = Source(f.read())
    # Test modules kept in their own file, and what lies under them, are test code.
    test_mods = {m + (t,) for m, s in sources.items() for t in s.test_files}
    for m in list(files):
        if any(m[: len(t)] == t for t in test_mods):
            del files[m], sources[m]

    def absolute(here, path):
        """`path`, named in module `here`, from the crate root; None when it is outside the
        crate."""
        if not path:
            return None
        if path[0] == "crate":
            parts = path[1:]
        elif path[0] == "super":
            base = list(here)
            while path and path[0] == "super":
                path = path[1:]
                base = base[:-1]
            parts = base + path
        elif path[0] == "self":
            parts = list(here) + path[1:]
        elif tuple(list(here) + [path[0]]) in files:
            parts = list(here) + path
        else:
            return None
        parts = [s for s in parts if s not in ("self", "*", "")]
        return parts or None

    reexports = {m: {} for m in files}
    for m, s in sources.items():
        for public, path, pos, _ in s.uses:
            target = absolute(m + tuple(s.scope(pos)), path)
            if public and target and not s.scope(pos):
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

    graph = {m: {} for m in files}
    for m, s in sources.items():
        named = [(p, pos, shown, public) for public, p, pos, shown in s.uses]
        named += [(p, pos, shown, False) for p, pos, shown in s.inline]
        for path, pos, shown, public in named:
            target = absolute(m + tuple(s.scope(pos)), path)
            if target is None:
                continue
            t = resolve(target)
            # A file re-exporting a child's item is the child's door, not a dependency.
            if t is None or t == m or (public and t[: len(m)] == m):
                continue
            graph[m].setdefault(t, set()).add((s.line(pos), shown))
    return files, graph


def python_packages(py_files):
    """The top-level Python packages among `py_files`: folders with an `__init__.py` whose
    parent has none."""
    dirs = {os.path.dirname(p) for p in py_files if os.path.basename(p) == "__init__.py"}
    return sorted(d for d in dirs if os.path.dirname(d) not in dirs)


def loading_imports(body):
    """The import statements of `body` that run when its module loads: at the top level and
    in top-level `if`/`try` blocks, except under `if TYPE_CHECKING:`."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name != "TYPE_CHECKING":
                yield from loading_imports(node.body)
            yield from loading_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in [node.body, node.orelse, node.finalbody] + [h.body for h in node.handlers]:
                yield from loading_imports(block)


def check_python_package(root):
    """The modules of the package at `root` (module path as a tuple -> file) and its import
    graph, as `check_crate`'s: graph[a][b] = {(line, what a imports)}."""
    package = os.path.basename(root)
    files = {}
    for base, _, names in os.walk(root):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(base, name)
                rel = tuple(os.path.relpath(path, root)[:-3].split(os.sep))
                files[rel[:-1] if rel[-1] == "__init__" else rel] = path
    graph = {m: {} for m in files}
    for m, path in files.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        # Where a relative import starts: the package itself, or the module's package.
        here = m if path.endswith("__init__.py") else m[:-1]
        for node in loading_imports(tree.body):
            named = []
            if isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == package:
                        named.append((tuple(parts[1:]), alias.name))
            else:
                if node.level:
                    if node.level - 1 > len(here):
                        continue
                    start = here[: len(here) - (node.level - 1)]
                    module = start + tuple(node.module.split(".")) if node.module else start
                elif node.module and node.module.split(".")[0] == package:
                    module = tuple(node.module.split(".")[1:])
                else:
                    continue
                dots = "." * node.level + (node.module or "")
                for alias in node.names:
                    # `from . import x` imports module x when there is one, else an item.
                    sub = module + (alias.name,)
                    named.append((sub if sub in files else module,
                                  f"from {dots} import {alias.name}"))
            for target, shown in named:
                while target and target not in files:
                    target = target[:-1]
                # A package importing its own submodules is their door.
                if target in files and target != m and target[: len(m)] != m:
                    graph[m].setdefault(target, set()).add((node.lineno, shown))
    return files, graph


def cycles(graph):
    """The strongly connected components of more than one file."""
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
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def shortest_cycle(graph, comp):
    """A shortest cycle through the first file of `comp`, as its files in order."""
    start, inside = comp[0], set(comp)
    before, queue = {start: None}, deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if w == start:
                path = [v]
                while before[path[-1]] is not None:
                    path.append(before[path[-1]])
                return path[::-1] + [start]
            if w in inside and w not in before:
                before[w] = v
                queue.append(w)
    return comp


def describe(crate, files, graph, comp):
    """A cycle, for a developer to act on: its files, a shortest loop, and each edge's lines."""
    def rel(m):
        return os.path.relpath(files[m]) if os.path.isabs(files[m]) else files[m]

    def name(m):
        return "::".join(m) or "crate root"

    loop = shortest_cycle(graph, comp)
    out = [
        f"{crate}: import cycle between {len(comp)} files: " + ", ".join(rel(m) for m in comp),
        "  shortest cycle: " + " -> ".join(name(m) for m in loop),
    ]
    for a in comp:
        for b in sorted(graph[a]):
            if b in comp:
                out.append(f"  {name(a)} -> {name(b)}:")
                for line, shown in sorted(graph[a][b]):
                    out.append(f"    {rel(a)}:{line}: {shown}")
    return "\n".join(out)


def main(argv):
    if argv[:1] == ["--self-test"]:
        return self_test()
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
            problems.append(describe(crate, files, graph, comp))
        for path in sorted(crate_files(os.path.join(crate or ".", "src")).values()):
            n = code_lines(path)
            if n > limit:
                problems.append(f"{path}: {n} lines of code (limit {limit})")
    py_files = [] if argv else os.popen("git ls-files '*.py'").read().split()
    packages = python_packages(py_files)
    for package in packages:
        files, graph = check_python_package(package)
        for comp in cycles(graph):
            problems.append(describe(package, files, graph, comp))
    for path in py_files:
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
    print(f"structure ok: {len(crates)} crates and {len(packages)} Python package(s), "
          f"no import cycle between files, no file over {limit} lines of code")
    return 0


# ---------------------------------------------------------------------------------------------
# --self-test: small crates with known graphs.

CYCLE = {
    "lib.rs": """\
//! A crate whose files `a` and `b` name each other only inline.
mod a;
mod b;
pub use a::Thing;
""",
    "a.rs": """\
pub struct Thing;

pub fn f() -> u32 {
    crate::b::VALUE
}
""",
    "b.rs": """\
pub const VALUE: u32 = 1;

pub fn g() -> crate::Thing {
    crate::Thing
}
""",
}

CLEAN = {
    "lib.rs": """\
mod a;
mod b;
mod c;
#[cfg(test)]
mod tests;
pub use b::y;
""",
    "a.rs": """\
pub const X: u32 = 1;

pub fn h() -> u32 {
    crate::y() + super::c::Z
}

mod inner {
    pub(crate) fn f() -> u32 {
        super::X
    }
}
""",
    "b.rs": r'''//! Names `a` only in comments, strings, attributes and tests: [`crate::a::X`].
use std::fmt;

/// See [`crate::a::X`] and [super::a::h].
pub fn y() -> u32 {
    // crate::a::X
    /* super::a::X /* nested: crate::a::X */ still a comment: crate::a::h */
    let s = "crate::a::X \" super::a::X";
    let r = r#"crate::a::X "quoted" self::a::X"#;
    let q = '"';
    let l: &'static str = "";
    let _ = (s, r, q, l, fmt::Error);
    2
}

#[doc = "crate::a::X"]
#[cfg_attr(any(), crate::a::marker)]
pub(in crate::b) fn z() {}

#[cfg(test)]
use crate::a::X;

#[cfg(test)]
fn helper() -> u32 {
    crate::a::X
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn t() {
        assert_eq!(crate::a::X + X + helper(), 3);
    }
}
''',
    "c.rs": """\
use crate::{
    b::{self, y as why},
};

pub const Z: u32 = 3;

pub fn w() -> u32 {
    why() + b::y()
}
""",
    "tests.rs": """\
use crate::a::X;
""",
}


PY_CYCLE = {
    "__init__.py": "from . import a\n",
    "a.py": "import os\n\nfrom .b import thing\n",
    "b.py": "try:\n    from pkg.a import x\nexcept ImportError:\n    x = None\nthing = 1\n",
}

PY_CLEAN = {
    "__init__.py": "from . import a, b\nfrom .sub import c\n",
    "a.py": "def f():\n    from . import b\n    return b\n",
    "b.py": "from typing import TYPE_CHECKING\n\nfrom .a import f\n"
            "if TYPE_CHECKING:\n    from .sub.c import C\n",
    "sub/__init__.py": "",
    "sub/c.py": "import pkg\n\nfrom ..b import f\n",
}


def write_package(base, name, files):
    root = os.path.join(base, name)
    for path, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        with open(os.path.join(root, path), "w", encoding="utf-8") as f:
            f.write(text)
    return root


def write_crate(base, name, files):
    crate = os.path.join(base, name)
    os.makedirs(os.path.join(crate, "src"))
    for path, text in files.items():
        with open(os.path.join(crate, "src", path), "w", encoding="utf-8") as f:
            f.write(text)
    return crate


def self_test():
    failures = []

    def expect(what, ok):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as base:
        crate = write_crate(base, "cycle", CYCLE)
        files, graph = check_crate(crate)
        found = cycles(graph)
        expect("an inline-path cycle between two files is found", found == [[("a",), ("b",)]])
        expect(
            "its edges name their lines and paths, re-exports followed to the defining file",
            graph[("a",)].get(("b",)) == {(4, "crate::b::VALUE")}
            and graph[("b",)].get(("a",)) == {(3, "crate::Thing"), (4, "crate::Thing")},
        )
        text = describe("cycle", files, graph, found[0]) if found else ""
        expect(
            "the report gives file:line and the path of each edge",
            "a.rs:4: crate::b::VALUE" in text and "b.rs:3: crate::Thing" in text,
        )

        crate = write_crate(base, "clean", CLEAN)
        files, graph = check_crate(crate)
        expect("no cycle through comments, doc links, strings, attributes or tests",
               not cycles(graph))
        expect(
            "code paths count: crate::, super::, a child module, re-exports, use trees",
            set(graph[("a",)]) == {("b",), ("c",)} and set(graph[("c",)]) == {("b",)},
        )
        expect("b names nothing of the crate outside comments, strings and tests",
               graph[("b",)] == {})
        expect("super:: inside an inline module is the file itself", () not in graph[("a",)])
        expect(
            "a use tree's leaves keep their own lines",
            graph[("c",)].get(("b",)) == {(2, "use crate::b::self"), (2, "use crate::b::y")},
        )
        expect("a #[cfg(test)] mod's file is left out", ("tests",) not in files)

        root = write_package(os.path.join(base, "py1"), "pkg", PY_CYCLE)
        files, graph = check_python_package(root)
        found = cycles(graph)
        expect("a Python import cycle (one side in a try block) is found",
               found == [[("a",), ("b",)]])
        text = describe("pkg", files, graph, found[0]) if found else ""
        expect("its report gives file:line and the import",
               "a.py:3: from .b import thing" in text
               and "b.py:2: from pkg.a import x" in text)
        root = write_package(os.path.join(base, "py2"), "pkg", PY_CLEAN)
        files, graph = check_python_package(root)
        expect("no Python cycle through imports in functions, under TYPE_CHECKING, or from a "
               "package to its submodules", not cycles(graph))
        expect("relative imports resolve: .a, ..b, a whole package",
               set(graph[("b",)]) == {("a",)} and set(graph[("sub", "c")]) == {(), ("b",)})
    print("self-test " + ("failed" if failures else "passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
