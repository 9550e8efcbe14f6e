#!/usr/bin/env python3
"""The tree's structure figures (the limits of docs/design.md, "Size"):
functions over a line count in src/, cli/ and python/ (C++ by brace
matching, Python by its ast), product files over a line count, and import
circles among the Python package's modules.

Usage: python3 scripts/structure.py [--function-lines N] [--file-lines N]
[--check]. Prints one line per finding and a summary; with --check, exits 1
when any function is over N (default 150) lines, any product file over the
file limit (default 700), or the Python modules import each other in a
circle (module-level imports; an import inside a function is a deferred
edge and does not count)."""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from typing import Dict, List, Set, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CXX_DIRS = ("src", "cli", "python/src")
PY_DIR = "python/softdot"
# Product files: the library, the command, the bindings and the package
# (tests, benchmarks and fuzz harnesses are not products).
PRODUCT_DIRS = ("src", "include", "cli", "python")


def strip_cxx(text: str) -> str:
    """Comments, strings and character literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == '"' or c == "'":
            if c == '"' and i > 0 and text[i - 1] == "R":  # raw string R"(...)"
                k = text.find("(", i)
                delim = text[i + 1 : k]
                j = text.find(")" + delim + '"', k)
                j = n if j < 0 else j + len(delim) + 2
            else:
                j = i + 1
                while j < n and text[j] != c:
                    j += 2 if text[j] == "\\" else 1
                j += 1
            out.append(" " + "\n" * text.count("\n", i, j))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


NOT_FUNCTION = re.compile(
    r"(\b(namespace|class|struct|union|enum)\b[^;{}()]*$)|(=\s*$)|(^\s*extern\s*$)"
)


def cxx_functions(path: str) -> List[Tuple[str, int, int]]:
    """(name, first line, lines) of each function body at namespace or class
    scope (lambdas and nested blocks count toward their function)."""
    text = strip_cxx(open(path, encoding="utf-8").read())
    res: List[Tuple[str, int, int]] = []
    # A stack of (kind, start line, header); kind "scope" (namespace, class,
    # struct, extern "C") or "function" or "block".
    stack: List[Tuple[str, int, str]] = []
    line = 1
    seg_start = 0
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == "{":
            header = text[seg_start:i]
            inside_function = any(k == "function" for k, _, _ in stack)
            h = header.strip()
            if inside_function:
                kind = "block"
            elif (
                NOT_FUNCTION.search(h)
                or not h.endswith((")", "const", "noexcept", "override", "final", "mutable"))
                and not re.search(r"\)\s*(const\s*)?(noexcept\s*)?(->\s*[\w:<>,\s*&]+)?$", h)
            ):
                kind = "scope"
            else:
                kind = "function"
            first = line
            name = ""
            if kind == "function":
                m = re.search(r"([~\w:<>]+)\s*\([^()]*(\([^()]*\)[^()]*)*\)[^()]*$", h)
                name = m.group(1) if m else h[-40:]
            stack.append((kind, first, name))
            seg_start = i + 1
        elif c == "}":
            if stack:
                kind, first, name = stack.pop()
                if kind == "function":
                    res.append((name, first, line - first + 1))
            seg_start = i + 1
        elif c == ";":
            seg_start = i + 1
    return res


def py_functions(path: str) -> List[Tuple[str, int, int]]:
    """(name, first line, lines) of each function: its lines of code and
    comments, without its docstring (documentation, as a C++ function's
    comment above it is not counted either)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    res = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            end = getattr(node, "end_lineno", node.lineno)
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            n = end - first + 1
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(getattr(body[0], "value", None), ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                n -= getattr(body[0], "end_lineno", body[0].lineno) - body[0].lineno + 1
            res.append((node.name, first, n))
    return res


def nested_python(path: str) -> Set[Tuple[int, int]]:
    """Spans of functions nested in other functions (counted in their parent)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    spans = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                if sub is not node and isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    spans.add((sub.lineno, getattr(sub, "end_lineno", sub.lineno)))
    return spans


def files(dirs: Tuple[str, ...], exts: Tuple[str, ...]) -> List[str]:
    out = []
    for d in dirs:
        for base, _, names in os.walk(os.path.join(ROOT, d)):
            for n in names:
                if n.endswith(exts):
                    out.append(os.path.join(base, n))
    return sorted(out)


def import_circles() -> List[List[str]]:
    """The package's modules that reach themselves through their imports:
    every relative import, at module level or inside a function, and
    importlib.import_module(".name") (a deferred import is still an edge:
    the modules depend on each other). __init__ is left out (it imports
    every module by design)."""
    pkg = os.path.join(ROOT, PY_DIR)
    mods = {n[:-3] for n in os.listdir(pkg) if n.endswith(".py")} - {"__init__"}
    edges: Dict[str, Set[str]] = {m: set() for m in mods}
    for m in mods:
        src = open(os.path.join(pkg, m + ".py"), encoding="utf-8").read()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
                edges[m].update(n for n in names if n in mods)
        edges[m].update(x for x in re.findall(r'import_module\("\.(\w+)"', src) if x in mods)

    def reach(a: str) -> Set[str]:
        seen: Set[str] = set()
        todo = [a]
        while todo:
            for w in edges[todo.pop()]:
                if w not in seen:
                    seen.add(w)
                    todo.append(w)
        return seen

    groups: List[List[str]] = []
    done: Set[str] = set()
    for m in sorted(mods):
        if m in done or m not in reach(m):
            continue
        group = sorted(x for x in reach(m) if m in reach(x))
        done.update(group)
        groups.append(group)
    return groups


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--function-lines", type=int, default=150)
    ap.add_argument("--file-lines", type=int, default=700)
    ap.add_argument("--report", type=int, default=100, help="list functions over this")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    over: List[Tuple[int, str]] = []
    for p in files(CXX_DIRS, (".cc", ".h")):
        for name, first, n in cxx_functions(p):
            if n > a.report:
                over.append((n, f"{os.path.relpath(p, ROOT)}:{first} {name}"))
    for p in files((PY_DIR,), (".py",)):
        nested = nested_python(p)
        for name, first, n in py_functions(p):
            if any(s <= first <= e for s, e in nested):
                continue
            if n > a.report:
                over.append((n, f"{os.path.relpath(p, ROOT)}:{first} {name}"))
    over.sort(reverse=True)
    for n, where in over:
        print(f"function {n:4d} lines  {where}")
    big = []
    for p in files(PRODUCT_DIRS, (".cc", ".h", ".py")):
        n = sum(1 for _ in open(p, encoding="utf-8"))
        if n > a.file_lines:
            big.append((n, os.path.relpath(p, ROOT)))
    for n, p in sorted(big, reverse=True):
        print(f"file     {n:4d} lines  {p}")
    cycles = import_circles()
    for c in cycles:
        print("circle   " + " <-> ".join(c))
    too_long = [x for x in over if x[0] > a.function_lines]
    print(
        f"structure: {len(over)} functions over {a.report} lines, {len(too_long)} over "
        f"{a.function_lines} (longest {over[0][0] if over else 0}); {len(big)} product files "
        f"over {a.file_lines} lines; {len(cycles)} import circles"
    )
    if a.check and (too_long or big or cycles):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
