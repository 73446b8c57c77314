"""Read a vLLM source tree with ``ast`` (never importing it): does a name exist, what is it,
where is it defined, what are its parameters.

Used by ``python -m vllm_anyorder.patches --check DIR`` (``upstream.py``) to verify a vLLM
release the plugin cannot import here (the 0.33 GPU wheel needs torch 2.14 and CUDA). It
follows what vLLM's own modules do to expose names: definitions, ``from x import y``
re-exports (absolute and relative), ``from x import *``, sub-packages, module ``__getattr__``
with the name as a string constant (vLLM's lazy attributes), class bases and ``self.x = ...``
assignments in methods (instance attributes).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path


@dataclass(frozen=True)
class Found:
    kind: str  # module, class, function, attribute, instance attribute, external, lazy
    file: Path | None = None
    line: int = 0
    node: ast.AST | None = None
    module: str = ""  # dotted module that defines it

    def where(self, root: Path) -> str:
        if self.file is None:
            return self.module
        return f"{self.file.relative_to(root).as_posix()}:{self.line}"

    def params(self) -> list[str]:
        """Parameter names in order (``*args`` as ``*args``, ``**kw`` as ``**kw``)."""
        if not isinstance(self.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return []
        a = self.node.args
        names = [x.arg for x in a.posonlyargs + a.args]
        names += [f"*{a.vararg.arg}"] if a.vararg else []
        names += [x.arg for x in a.kwonlyargs]
        return names + ([f"**{a.kwarg.arg}"] if a.kwarg else [])

    def decorators(self) -> list[str]:
        node = self.node
        return [ast.unparse(d) for d in getattr(node, "decorator_list", [])]


class Module:
    """One parsed module: its top-level bindings (including those under ``if`` / ``try``)."""

    def __init__(self, name: str, path: Path):
        self.name, self.path = name, path
        self.tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        self.bindings: dict[str, ast.AST] = {}
        self.star_imports: list[str] = []
        self._collect(self.tree.body)

    def _collect(self, body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                self.bindings[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            self.bindings.setdefault(n.id, node)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if alias.name == "*":
                        self.star_imports.append(self.absolute(node))
                    else:
                        key = alias.asname or alias.name.split(".")[0]
                        self.bindings.setdefault(key, node)
            elif isinstance(node, (ast.If, ast.Try)):
                for part in ("body", "orelse", "finalbody"):
                    self._collect(getattr(node, part, []))
                for handler in getattr(node, "handlers", []):
                    self._collect(handler.body)

    def absolute(self, node: ast.ImportFrom) -> str:
        """The dotted module an ``ImportFrom`` names, relative imports resolved."""
        if not node.level:
            return node.module or ""
        is_package = self.path.name == "__init__.py"
        parts = self.name.split(".")[: len(self.name.split(".")) - node.level + is_package]
        return ".".join(parts + ([node.module] if node.module else []))

    @cached_property
    def strings(self) -> set[str]:
        return {n.value for n in ast.walk(self.tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)}


class SourceTree:
    """The ``vllm`` package under ``root`` (the directory that holds ``vllm/``)."""

    def __init__(self, root: Path, package: str = "vllm"):
        self.root, self.package = Path(root), package
        self._modules: dict[str, Module | None] = {}

    def version(self) -> str:
        """``__version__`` from ``vllm/_version.py`` (written by the wheel build), or ''."""
        path = self.root / self.package / "_version.py"
        if not path.exists():
            return ""
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                    any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
                return str(node.value.value)
        return ""

    def module(self, dotted: str) -> Module | None:
        if dotted not in self._modules:
            base = self.root.joinpath(*dotted.split("."))
            path = next((p for p in (base.with_suffix(".py"), base / "__init__.py")
                         if p.is_file()), None)
            self._modules[dotted] = Module(dotted, path) if path else None
        return self._modules[dotted]

    def lookup(self, module: str, name: str, _seen: frozenset = frozenset()) -> Found | None:
        """What ``from <module> import <name>`` would give, or None if it would fail."""
        if (module, name) in _seen:
            return None
        seen = _seen | {(module, name)}
        mod = self.module(module)
        if mod is None:
            return None
        node = mod.bindings.get(name)
        if isinstance(node, ast.ImportFrom):
            source = mod.absolute(node)
            original = next(a.name for a in node.names if (a.asname or a.name) == name)
            if not source.split(".")[0] == self.package:
                return Found("external", module=f"{source}.{original}")
            return self.lookup(source, original, seen) or self._submodule(source, original)
        if isinstance(node, ast.Import):
            return Found("external", module=name)
        if node is not None:
            kind = {ast.ClassDef: "class", ast.FunctionDef: "function",
                    ast.AsyncFunctionDef: "function"}.get(type(node), "attribute")
            return Found(kind, mod.path, node.lineno, node, module)
        sub = self._submodule(module, name)
        if sub:
            return sub
        for star in mod.star_imports:
            found = self.lookup(star, name, seen) if not name.startswith("_") else None
            if found:
                return found
        if "__getattr__" in mod.bindings and name in mod.strings:
            getter = mod.bindings["__getattr__"]
            return Found("lazy", mod.path, getter.lineno, getter, module)
        return None

    def _submodule(self, module: str, name: str) -> Found | None:
        sub = self.module(f"{module}.{name}")
        return Found("module", sub.path, 1, sub.tree, sub.name) if sub else None

    def member(self, owner: Found, attr: str, _depth: int = 0) -> Found | None:
        """``owner.attr`` for a class (its body, ``self.attr =`` in its methods, then its
        bases) or a module."""
        if owner.kind == "module":
            return self.lookup(owner.module, attr)
        if owner.kind != "class" or _depth > 8:
            return None
        cls = owner.node
        assigned = None
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                    node.name == attr:
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                return Found(kind, owner.file, node.lineno, node, owner.module)
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
                    return Found("attribute", owner.file, node.lineno, node, owner.module)
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and node.attr == attr and \
                    isinstance(node.ctx, ast.Store) and \
                    isinstance(node.value, ast.Name) and node.value.id == "self":
                assigned = assigned or Found("instance attribute", owner.file, node.lineno,
                                             node, owner.module)
        if assigned:
            return assigned
        for base in cls.bases:
            found = self._base(owner.module, base)
            hit = self.member(found, attr, _depth + 1) if found else None
            if hit:
                return hit
        return None

    def _base(self, module: str, base: ast.expr) -> Found | None:
        if isinstance(base, ast.Name):
            return self.lookup(module, base.id)
        if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
            holder = self.lookup(module, base.value.id)
            return self.member(holder, base.attr) if holder else None
        return None

    def resolve(self, module: str, qualname: str) -> Found | None:
        """``module`` + ``"Class.method"`` (or ``"name"``) -> what it is, or None."""
        first, *rest = qualname.split(".")
        found = self.lookup(module, first)
        for attr in rest:
            found = self.member(found, attr) if found else None
        return found
