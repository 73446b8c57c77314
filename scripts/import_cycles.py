"""Import cycles among the modules of a package tree, function-level imports included.

    python scripts/import_cycles.py vllm_anyorder training

Reads each ``.py`` file under the given folders with ``ast`` (nothing is imported), builds the
graph module -> modules of the same trees it imports (``import a.b``, ``from a import b``,
``from . import b``, ``from .b import c``; imports inside functions and ``if TYPE_CHECKING``
count), and prints every strongly connected component of more than one module with the
imports inside it. Exit status 1 when there is a cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(tree: ast.AST, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that a module imports: ``import a.b`` -> the deepest of
    ``a.b``, ``a``; ``from a import b`` -> ``a.b`` if it is a module, else ``a`` (the parent
    packages a submodule import runs implicitly are not counted)."""
    package = name if is_package else name.rpartition(".")[0]

    def deepest(dotted: str) -> str:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted

    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(deepest(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in modules else deepest(base))
    out.discard("")
    out.discard(name)
    return out


def graph(folders: list[str]) -> dict[str, set[str]]:
    files = {module_name(p): p for f in folders for p in sorted((ROOT / f).rglob("*.py"))}
    return {name: imported(ast.parse(path.read_text()), name, path.name == "__init__.py",
                           set(files))
            for name, path in files.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def main(argv: list[str]) -> int:
    status = 0
    for folder in argv or ["vllm_anyorder", "training"]:
        edges = graph([folder])
        found = cycles(edges)
        n_edges = sum(len(t) for t in edges.values())
        print(f"{folder}: {len(edges)} modules, {n_edges} imports, "
              f"{len(found) or 'no'} cycle{'s' if len(found) != 1 else ''}")
        for comp in found:
            status = 1
            members = set(comp)
            print("  cycle: " + ", ".join(comp))
            for v in comp:
                for w in sorted(edges[v] & members):
                    print(f"    {v} -> {w}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
