#!/usr/bin/env python3
"""Import circles in src/: between files and between top-level modules.

Reads every module reachable from src/lib.rs through `mod x;`, resolves
each `use` (crate::, super::, self::, a child module) and every inline
`crate::`/`super::`/`self::` path, and a module imported by `use` then
named in the code (`consul::watch::Failure`), to the file that defines the
item, following re-exports (`pub use watch::Failure` in consul/mod.rs is
consul/watch.rs). Comments and string literals are skipped. A parent's
`mod child;` is not an import; a child's `use super::x` is one.

Prints every circle (the strongly connected components of the import
graph, each with one cycle through it) between files, then between the
top-level modules (src/<x>), and exits 1 if there is any.

Test code (`#[cfg(test)]` modules and items) is left out: a unit test
may use a helper that uses the code under test. `--tests` counts it too.
A `pub use` whose name the file never uses itself (a parent's outline:
`pub use swap::Swapper` in state.rs) is not the file's import: whoever
names `crate::state::Swapper` imports state/swap.rs. `--reexports`
counts it too.

    scripts/import-circles.py [--tests] [--reexports] [--edges] [--root DIR]
"""

import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip(text):
    """The text with comments, strings and char literals blanked (same length)."""
    out = []
    i, n = 0, len(text)

    def blank(s):
        return re.sub(r"[^\n]", " ", s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 0, i
            while j < n:
                if text.startswith("/*", j):
                    depth += 1
                    j += 2
                elif text.startswith("*/", j):
                    depth -= 1
                    j += 2
                    if depth == 0:
                        break
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif re.match(r'b?r#*"', text[i:i + 40]) and (i == 0 or not re.match(r"\w", text[i - 1])):
            m = re.match(r'(b?r)(#*)"', text[i:])
            end = '"' + m.group(2)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append(blank(text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(blank(text[i:j + 1]))
            i = j + 1
        elif c == "'":
            m = re.match(r"'(\\(x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])'", text[i:])
            if m:
                out.append(blank(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


TEST_ATTR = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?$")


def test_only(text, pos):
    """Whether the item starting at `pos` is under `#[cfg(test)]`."""
    return TEST_ATTR.search(text[max(0, pos - 200) : pos]) is not None


def expand_use(tree):
    """`a::{b, c::{d, self}} as e` -> [(['a','b'], 'b'), ...]: each path and its local name."""
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        return parts

    def walk(prefix, s):
        if "{" in s and s.endswith("}"):
            head = s[: s.index("{")]
            head_segs = [p for p in head.split("::") if p]
            for part in split_top(s[s.index("{") + 1 : -1]):
                yield from walk(prefix + head_segs, part)
            return
        alias = None
        if "as" in s and re.search(r"[A-Za-z0-9_*]as[A-Za-z_]", s):
            # `x as y` lost its spaces: split at the last `as` after an ident.
            m = re.match(r"(.*[A-Za-z0-9_*])as(" + IDENT + ")$", s)
            if m and "::" not in m.group(2):
                s, alias = m.group(1), m.group(2)
        segs = prefix + [p for p in s.split("::") if p]
        if segs and segs[-1] == "self":
            segs = segs[:-1]
        if not segs:
            return
        name = alias or segs[-1]
        yield segs, name

    return list(walk([], tree))


class Crate:
    def __init__(self, root, tests, reexports):
        self.root = root
        self.tests = tests  # whether `#[cfg(test)]` code counts
        self.reexports = reexports  # whether a bare `pub use` is an import
        self.modules = {}  # module path tuple -> file
        self.inline = {}  # file -> [(start, end, name)] inline module spans
        self.code = {}  # file -> stripped text
        self.uses = {}  # module path tuple -> [(segs, local name, pos, pub)]
        self.use_spans = {}  # file -> [(start, end)] of its `use` statements
        self.load((), os.path.join(root, "src", "lib.rs"))

    def load(self, path, file):
        text = strip(open(file, encoding="utf-8").read())
        # `pub(in crate::a::b)` names where an item is seen, not an import.
        text = re.sub(r"pub\s*\(\s*in\s+[^)]*\)", lambda m: "pub" + " " * (len(m.group(0)) - 3), text)
        self.code[file] = text
        self.modules[path] = file
        spans = []
        for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", text):
            depth, j = 0, m.end() - 1
            while j < len(text):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            spans.append((m.start(), j, m.group(1), test_only(text, m.start())))
        self.inline[file] = spans
        for start, end, _, _ in spans:
            self.modules[path + tuple(self.chain(file, start + 1))] = file
        base = os.path.dirname(file)
        stem = os.path.basename(file)[:-3]
        if stem not in ("mod", "lib", "main"):
            base = os.path.join(base, stem)
        for m in re.finditer(r"(?m)^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", text):
            if self.chain(file, m.start()):
                continue  # `mod x;` inside an inline module: not in this tree
            if not self.tests and test_only(text, m.start()):
                continue
            name = m.group(1)
            for cand in (os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")):
                if os.path.exists(cand):
                    self.load(path + (name,), cand)
                    break
        self.use_spans[file] = []
        for m in re.finditer(r"(\bpub(?:\([^)]*\))?\s+)?\buse\s+([^;]*);", text):
            self.use_spans[file].append((m.start(), m.end()))
            if self.skipped(file, m.start()):
                continue
            mod = path + tuple(self.chain(file, m.start()))
            for segs, name in expand_use(m.group(2)):
                self.uses.setdefault(mod, []).append((segs, name, m.start(), m.group(1) is not None))

    def chain(self, file, pos):
        """The inline modules around `pos` in `file`, outermost first."""
        return [name for (s, e, name, _) in self.inline[file] if s < pos < e]

    def skipped(self, file, pos):
        """Whether `pos` is test code and test code does not count."""
        if self.tests:
            return False
        text = self.code[file]
        return test_only(text, pos) or any(s < pos < e and t for (s, e, _, t) in self.inline[file])

    def absolute(self, mod, segs):
        """A path written in module `mod` as an absolute module path, or None (std, a crate)."""
        if not segs:
            return None
        head = segs[0]
        if head == "crate":
            return list(segs[1:])
        if head in ("super", "self"):
            cur = list(mod)
            rest = list(segs)
            while rest and rest[0] in ("super", "self"):
                if rest.pop(0) == "super":
                    cur = cur[:-1]
            return cur + rest
        if tuple(mod) + (head,) in self.modules:
            return list(mod) + list(segs)
        return None

    def resolve(self, segs, seen=None):
        """The file defining the item at absolute path `segs` (re-exports followed)."""
        seen = seen or set()
        k = len(segs)
        while k > 0 and tuple(segs[:k]) not in self.modules:
            k -= 1
        mod = tuple(segs[:k])
        rest = segs[k:]
        if rest and rest[0] != "*" and (mod, rest[0]) not in seen:
            seen.add((mod, rest[0]))
            for usegs, name, _, _ in self.uses.get(mod, []):
                if name == rest[0]:
                    target = self.absolute(mod, usegs)
                    if target is not None:
                        return self.resolve(target + rest[1:], seen)
        return self.modules[mod]

    def edges(self):
        """file -> set of files it imports."""
        graph = {f: set() for f in self.code}
        for mod, uses in self.uses.items():
            file = self.modules[mod]
            for segs, name, _, public in uses:
                target = self.absolute(mod, segs)
                if target is None:
                    continue
                if public and not self.reexports and not self.names(file, name):
                    continue  # a re-export the file itself never names: its outline
                if tuple(target) in self.modules and segs[-1:] != ["*"]:
                    continue  # a module imported by name: its uses in the code count
                graph[file].add(self.resolve(target))
        for mod, file in self.modules.items():
            text = self.code[file]
            if self.modules.get(mod[:-1]) == file and mod:
                continue  # an inline module: scanned with its file
            # A module imported by name (`use crate::consul;`) and then named in the code.
            aliases = {}
            for usegs, name, _, _ in self.uses.get(mod, []):
                target = self.absolute(mod, usegs)
                if target is not None and tuple(target) in self.modules:
                    aliases[name] = target
            for m in re.finditer(r"(?<![\w:$])(" + IDENT + r")((?:::" + IDENT + r")+)", text):
                segs = [m.group(1)] + m.group(2).split("::")[1:]
                if self.in_use(file, m.start()) or self.skipped(file, m.start()):
                    continue
                here = tuple(mod) + tuple(self.chain(file, m.start()))
                if segs[0] in ("crate", "super", "self"):
                    target = self.absolute(here, segs)
                elif segs[0] in aliases:
                    target = aliases[segs[0]] + segs[1:]
                else:
                    continue
                graph[file].add(self.resolve(target))
        for f in graph:
            graph[f].discard(f)
        return graph

    def names(self, file, name):
        """Whether `file` names `name` outside its `use` statements."""
        text = self.code[file]
        return any(
            not self.in_use(file, m.start()) for m in re.finditer(r"(?<![\w:])" + re.escape(name) + r"\b", text)
        )

    def in_use(self, file, pos):
        """Whether `pos` is inside a `use ...;` statement of `file`."""
        return any(s <= pos < e for s, e in self.use_spans[file])


def components(graph):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def cycles(graph, comp, limit=200):
    """The elementary cycles inside one component (each once, from its least node)."""
    members = sorted(comp)
    found = []

    def walk(start, path, on):
        for w in sorted(graph[path[-1]]):
            if len(found) >= limit:
                return
            if w == start:
                found.append(path + [start])
            elif w in on_set and w > start and w not in on:
                on.add(w)
                walk(start, path + [w], on)
                on.discard(w)

    on_set = set(members)
    for start in members:
        walk(start, [start], {start})
    return found


def main():
    args = sys.argv[1:]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if "--root" in args:
        root = args[args.index("--root") + 1]
    crate = Crate(root, "--tests" in args, "--reexports" in args)
    src = os.path.join(root, "src") + os.sep
    graph = {f[len(src):]: {t[len(src):] for t in ts} for f, ts in crate.edges().items()}
    if "--edges" in args:
        for f in sorted(graph):
            for t in sorted(graph[f]):
                print(f"{f} -> {t}")

    def top(f):
        first = f.split("/")[0]
        return first[:-3] if first.endswith(".rs") else first

    modules = {}
    for f, ts in graph.items():
        if f == "lib.rs":
            continue
        modules.setdefault(top(f), set()).update(top(t) for t in ts if t != "lib.rs")
    for m in modules:
        modules[m].discard(m)

    file_circles = components(graph)
    module_circles = components(modules)
    for what, g, comps in (("file", graph, file_circles), ("module", modules, module_circles)):
        print(f"{what} circles: {len(comps)} (tangles of mutually importing {what}s)")
        for comp in comps:
            print(f"  {', '.join(comp)}:")
            for c in cycles(g, comp):
                print("    " + " -> ".join(c))
    return 1 if file_circles or module_circles else 0


if __name__ == "__main__":
    sys.exit(main())
