"""What the plugin's own source uses of vLLM, read with ``ast`` (half of the expectations
``python -m vllm_anyorder.patches --check DIR`` verifies; ``upstream.py`` holds the other,
hand-written half and the check).

* ``_compat.py``: every ``_module("vllm.x").Name`` an accessor returns, and every ``.attr``
  the plugin reads or writes on what an accessor returns (``cls = _compat.
  gpu_model_runner_cls(); cls._sample = ...``);
* every ``from vllm... import ...`` / ``import vllm...`` in ``vllm_anyorder/``;
* every method a plugin class defines over a vLLM base class (attention backends, builders,
  impls): the base must define it with the same parameters, or the override is dead.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from vllm_anyorder.patches.source_tree import Found

PLUGIN = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Expect:
    """``symbol`` = ``"dotted.module:Qual.name"`` (qualname empty: the module itself).

    ``params``: the parameter names in order; a trailing ``"..."`` admits more after them.
    ``contains``: names that must be among the parameters (bound by keyword).
    ``decorator``: must decorate the definition (e.g. ``staticmethod``).
    ``same_as``: must resolve to the same definition (inherited, not overridden)."""

    symbol: str
    used_by: str
    params: tuple[str, ...] | None = None
    contains: tuple[str, ...] = ()
    decorator: str = ""
    same_as: str = ""

    @property
    def module(self) -> str:
        return self.symbol.split(":")[0]

    @property
    def qualname(self) -> str:
        return self.symbol.partition(":")[2]


def _vllm(name: str) -> bool:
    return name == "vllm" or name.startswith("vllm.")


def _module_call(node: ast.AST) -> str | None:
    """``"m"`` for a call ``_module("m")``, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
            node.func.id == "_module" and node.args and isinstance(node.args[0], ast.Constant):
        return node.args[0].value
    return None


def compat_accessors(source: Path = PLUGIN / "_compat.py") -> dict[str, str]:
    """``_compat`` function -> the vLLM symbol it returns (``"m:"`` a module, ``"m:Name"``
    a name in it), from the ``_module("m")`` calls in its body."""
    out = {}
    for fn in ast.parse(source.read_text()).body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and _module_call(node.value):
                out[fn.name] = f"{_module_call(node.value)}:{node.attr}"
            elif isinstance(node, ast.Return) and _module_call(node.value):
                out[fn.name] = f"{_module_call(node.value)}:"
    return {k: v for k, v in out.items() if _vllm(v.split(":")[0])}


def _plugin_files() -> list[Path]:
    return sorted(p for p in PLUGIN.rglob("*.py") if "__pycache__" not in p.parts)


def _bindings(nodes, accessors: dict[str, str]) -> dict[str, str]:
    """Names assigned ``_compat.f()`` among ``nodes`` -> the symbol ``f`` returns (kept when
    it is a module, or a class: a CamelCase name)."""
    bound = {}
    for node in nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
                    func.value.id == "_compat" and func.attr in accessors:
                symbol = accessors[func.attr]
                name = symbol.split(":")[1]
                if not name or (name.lstrip("_")[:1].isupper() and not name.isupper()):
                    bound.update({t.id: symbol for t in node.targets if isinstance(t, ast.Name)})
    return bound


def _uses_of_accessors(tree: ast.Module, accessors: dict[str, str], rel: str) -> list[Expect]:
    """``x = _compat.f()`` then ``x.attr``: the attribute on what ``f`` returns. Names bound
    at module level count in the whole file, names bound in a function in that function."""
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef,
                                                             ast.AsyncFunctionDef))]
    scopes = [(tree, _bindings(tree.body, accessors))]
    scopes += [(fn, _bindings(ast.walk(fn), accessors)) for fn in functions]
    out = []
    for scope, bound in scopes:
        for node in ast.walk(scope):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id in bound:
                module, name = bound[node.value.id].split(":")
                out.append(Expect(f"{module}:{name + '.' if name else ''}{node.attr}", rel))
    return out


# methods of the plugin's subclasses of vLLM classes that override nothing in vLLM
NOT_OVERRIDES = {
    "DllmCPUMetadataBuilder.node_plan": "the plugin's own (dLLM node plans)",
    "TorchPagedImpl.do_kv_cache_update": "called by name on any impl "
                                         "(model_executor/layers/attention/attention.py)",
}


def _base_symbol(base: ast.expr, imported: dict[str, str], bound: dict[str, str]) -> str:
    if isinstance(base, ast.Name):
        return imported.get(base.id, "")
    if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and \
            base.value.id in bound:
        module, name = bound[base.value.id].split(":")
        return f"{module}:{name + '.' if name else ''}{base.attr}"
    return ""


def _overrides(tree: ast.Module, accessors: dict[str, str], rel: str) -> list[Expect]:
    """Each method a plugin class defines over a vLLM base class: the base must have it
    with the same parameters (a trailing ``**kwargs`` of the override admits more)."""
    imported = {a.asname or a.name: f"{n.module}:{a.name}" for n in tree.body
                if isinstance(n, ast.ImportFrom) and _vllm(n.module or "") for a in n.names}
    bound = _bindings(tree.body, accessors)
    out = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        bases = [b for b in (_base_symbol(x, imported, bound) for x in cls.bases) if b]
        for fn in cls.body:
            if not bases or not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or \
                    f"{cls.name}.{fn.name}" in NOT_OVERRIDES or \
                    any(ast.unparse(d) == "property" for d in fn.decorator_list):
                continue
            params = Found("function", node=fn).params()
            if params and params[-1].startswith("**"):
                params = params[:-1] + ["..."]
            out.append(Expect(f"{bases[0]}.{fn.name}", f"{rel} {cls.name} (override)",
                              tuple(params)))
    return out


def derived() -> list[Expect]:
    """Expectations read from ``_compat.py`` and the plugin's own ``vllm`` imports."""
    accessors = compat_accessors()
    out = [Expect(symbol, f"_compat.{fn}") for fn, symbol in accessors.items()]
    for path in _plugin_files():
        rel = path.relative_to(PLUGIN.parent).as_posix()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and _vllm(node.module or ""):
                out += [Expect(f"{node.module}:{a.name}", rel) for a in node.names]
            elif isinstance(node, ast.Import):
                out += [Expect(f"{a.name}:", rel) for a in node.names if _vllm(a.name)]
        out += _uses_of_accessors(tree, accessors, rel) + _overrides(tree, accessors, rel)
    return out
