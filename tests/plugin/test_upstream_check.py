"""``python -m vllm_anyorder.patches --check DIR``: every patched attribute and private
import the plugin uses, verified in a vLLM source tree read with ``ast`` (never imported).

Run against the installed vLLM (0.32, CI) here; against the 0.33 wheel by hand
(docs/UPSTREAM.md). The failure cases use a copy of the installed tree (symlinks) with one
file changed, and tiny hand-written trees."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_anyorder import patches
from vllm_anyorder.patches import upstream
from vllm_anyorder.patches.__main__ import main as patches_main
from vllm_anyorder.patches.plugin_uses import Expect
from vllm_anyorder.patches.source_tree import SourceTree

RUNNER_FILE = Path("v1", "worker", "gpu_model_runner.py")


def installed_vllm() -> Path:
    spec = importlib.util.find_spec("vllm")  # locates the package without importing it
    assert spec is not None and spec.submodule_search_locations, "vLLM is not installed"
    return Path(list(spec.submodule_search_locations)[0])


def test_installed_vllm_meets_every_expectation():
    results = upstream.check(upstream.package_root(installed_vllm()))
    assert [(r.expect.symbol, r.problem) for r in results if r.problem] == []
    symbols = {r.expect.symbol for r in results}
    # the three sources of expectations all contribute
    assert "vllm.v1.worker.gpu_model_runner:GPUModelRunner._sample" in symbols  # table
    assert "vllm.v1.attention.backends.registry:register_backend" in symbols  # _compat use
    assert "vllm.model_executor.layers.linear:RowParallelLinear" in symbols  # import
    assert "vllm.v1.attention.backend:AttentionImpl.forward" in symbols  # override


def test_every_ledger_wrap_has_an_expectation():
    assert upstream.uncovered_wraps(patches.LEDGER, upstream.expectations()) == []
    assert upstream.wrapped_symbols("A.f, .g, m.h") == ["A.f", "A.g", "m.h"]
    missing = patches.Patch("p", "", "Nowhere.attr", lambda: None)
    assert upstream.uncovered_wraps([missing], upstream.expectations()) == ["p: Nowhere.attr"]


def _mirror(tmp_path: Path) -> Path:
    """A tree of symlinks to the installed vLLM's ``.py`` files (cheap to build)."""
    root = tmp_path / "tree"
    def skip(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if n == "__pycache__" or
                not (n.endswith(".py") or (Path(folder) / n).is_dir())]

    shutil.copytree(installed_vllm(), root / "vllm", copy_function=os.symlink, ignore=skip)
    return root


def _rewrite(root: Path, rel: Path, old: str, new: str) -> None:
    """Replace every ``old`` in one file of the mirror (there must be one)."""
    path = root / "vllm" / rel
    text = path.read_text()
    assert old in text, old
    path.unlink()  # a symlink: replace it with a changed copy
    path.write_text(text.replace(old, new))


def test_check_fails_on_a_changed_signature_and_a_missing_attribute(tmp_path, capsys):
    root = _mirror(tmp_path)
    assert patches_main(["--check", str(root)]) == 0
    _rewrite(root, RUNNER_FILE, "    def _sample(\n        self,\n",
             "    def _sample(\n        self,\n        new_first_argument,\n")
    _rewrite(root, RUNNER_FILE, "self._draft_prob_req_ids", "self._draft_prob_ids_renamed")
    capsys.readouterr()
    assert patches_main(["--check", str(root / "vllm")]) == 1  # DIR may be the package too
    failed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 2, failed
    sample = next(line for line in failed if "GPUModelRunner._sample " in line)
    assert "new_first_argument" in sample and "verification_hook" in sample
    assert any("GPUModelRunner._draft_prob_req_ids" in line and "missing" in line
               for line in failed)


def _tree(tmp_path: Path, files: dict[str, str]) -> SourceTree:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return SourceTree(tmp_path)


def test_source_tree_follows_how_vllm_exposes_names(tmp_path):
    tree = _tree(tmp_path, {
        "vllm/__init__.py": """
            MODULE_ATTRS = {"Lazy": ".impl:Lazy"}
            def __getattr__(name): ...
            """,
        "vllm/_version.py": "__version__ = version = '9.9.9'\n",
        "vllm/pkg/__init__.py": "from .impl import *\nfrom vllm.pkg.impl import Base as Alias\n",
        "vllm/pkg/impl.py": """
            class Base:
                attr = 1
                def method(self, a, *args, b=None, **kw): ...
                @staticmethod
                def static(): ...
            class Child(Base):
                def __init__(self):
                    self.field = 2
            def _private(): ...
            """,
    })
    assert tree.version() == "9.9.9"
    assert tree.resolve("vllm.pkg", "Child").kind == "class"  # star import
    assert tree.resolve("vllm.pkg", "Alias.attr").kind == "attribute"  # re-export
    assert tree.resolve("vllm.pkg", "_private") is None  # star imports skip private names
    assert tree.resolve("vllm.pkg", "impl").kind == "module"  # a submodule
    assert tree.resolve("vllm", "Lazy").kind == "lazy"  # module __getattr__
    assert tree.resolve("vllm", "Absent") is None
    child_method = tree.resolve("vllm.pkg.impl", "Child.method")  # inherited
    assert child_method.params() == ["self", "a", "*args", "b", "**kw"]
    assert tree.resolve("vllm.pkg.impl", "Child.field").kind == "instance attribute"
    assert tree.resolve("vllm.pkg.impl", "Child.nothing") is None
    check = lambda **kw: upstream.check_one(tree, Expect("vllm.pkg.impl:Child.method", "t",
                                                          **kw)).problem
    assert check(params=("self", "a", "...")) == ""
    assert "expected (self, b)" in check(params=("self", "b"))
    assert check(contains=("b", "a")) == ""
    assert "['c']" in check(contains=("c",))
    assert "staticmethod" in check(decorator="staticmethod")
    assert check(same_as="vllm.pkg.impl:Base.method") == ""
    static = upstream.check_one(tree, Expect("vllm.pkg:Alias.static", "t", (),
                                             decorator="staticmethod"))
    assert static.problem == "" and static.found.where(tmp_path) == "vllm/pkg/impl.py:6"


def test_cli_reports_a_directory_without_vllm(tmp_path):
    with pytest.raises(FileNotFoundError, match="no vllm package"):
        upstream.package_root(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "vllm_anyorder.patches", "--check",
                           str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode != 0 and "no vllm package" in proc.stderr
