"""Plugin packaging and registration: entry point, idempotent register(), light import,
a complete patch ledger, the method table and the console script. Heavy imports (vLLM)
run in fresh interpreters so this process's state and test order do not matter."""

import importlib
import importlib.metadata as metadata
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

import vllm_anyorder
from vllm_anyorder import config, methods, patches


def run_python(code, timeout=120, **env):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def console_script():
    found = Path(sys.executable).parent / "vllm-anyorder"
    return str(found) if found.exists() else shutil.which("vllm-anyorder")


@pytest.fixture(scope="module", autouse=True)
def cli_version():
    """``vllm-anyorder --version`` (about 10 s of vLLM imports), started with the module so
    it overlaps the other tests; test_console_script_reports_the_vllm_version waits for it."""
    script = console_script()
    proc = script and subprocess.Popen(
        [script, "--version"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "VLLM_PLUGINS": ""})
    yield proc
    if proc and proc.poll() is None:
        proc.kill()
        proc.communicate()


def test_entry_point_resolves_to_register():
    eps = [ep for ep in metadata.entry_points(group="vllm.general_plugins")
           if ep.name == "vllm_anyorder"]
    assert len(eps) == 1, eps
    assert eps[0].value == "vllm_anyorder:register"
    assert eps[0].load() is vllm_anyorder.register


def test_register_twice_applies_the_front_end_patches_once():
    result = run_python("""
        import json
        import vllm_anyorder
        from vllm_anyorder import _compat, patches

        vllm_anyorder.register()
        cls = _compat.engine_args_cls()
        first = cls.create_speculative_config
        kernel = getattr(_compat.cpu_triton_utils(), "_expand_kernel_impl", None)
        vllm_anyorder.register()
        vllm_anyorder.apply_front_end_patches()  # even called directly, nothing is re-wrapped
        print(json.dumps({
            "applied": sorted(patches.applied()),
            "same_wrapper": cls.create_speculative_config is first,
            "kernel_same": getattr(_compat.cpu_triton_utils(), "_expand_kernel_impl", None)
                           is kernel,
            "wrapped_by_us": "vllm_anyorder/patches/" in first.__code__.co_filename,
            "wraps_vllm": not hasattr(first.__wrapped__, "__wrapped__")
                          and first.__wrapped__.__module__ == "vllm.engine.arg_utils",
        }))
    """, VLLM_PLUGINS="")
    assert result["applied"] == ["cpu_expand_kernel", "cpu_greedy_verification",
                                 "cpu_padded_drafts", "cpu_sampled_verification",
                                 "drafts_with_output", "infill_requests",
                                 "method_names", "spec_method_choices", "v1_model_runner"]
    assert result["same_wrapper"] and result["kernel_same"]
    assert result["wrapped_by_us"] and result["wraps_vllm"]


def test_disabled_patch_is_skipped(monkeypatch):
    """VLLM_ANYORDER_DISABLE_PATCHES, on fake vLLM modules (no vLLM import)."""
    from types import SimpleNamespace

    from vllm_anyorder import _compat

    class FakeEngineArgs:
        def create_speculative_config(self, target_model_config, target_parallel_config):
            return "stock"

    class FakeInputProcessor:
        def process_inputs(self, request_id, prompt, params, *args, **kwargs):
            return "stock"

    class FakeVllmConfig:
        def _get_v2_model_runner_unsupported_features(self):
            return []

        @property
        def use_v2_model_runner(self):
            return False

    class FakeRejectionSampler:
        def forward(self, metadata, draft_probs, logits, sampling_metadata):
            return "stock"

    stock = FakeEngineArgs.create_speculative_config
    kernels = SimpleNamespace(_expand_kernel_impl=lambda *a: None)
    stock_kernel = kernels._expand_kernel_impl
    monkeypatch.setattr(patches, "_APPLIED", set())
    monkeypatch.setattr(_compat, "engine_args_cls", lambda: FakeEngineArgs)
    monkeypatch.setattr(_compat, "cpu_triton_utils", lambda: kernels)
    monkeypatch.setattr(_compat, "input_processor_cls", lambda: FakeInputProcessor)
    monkeypatch.setattr(_compat, "vllm_config_cls", lambda: FakeVllmConfig)
    monkeypatch.setattr(_compat, "rejection_sampler_cls", lambda: FakeRejectionSampler)
    monkeypatch.setattr(_compat, "sampler_output_cls", lambda: dict)
    monkeypatch.setenv("VLLM_ANYORDER_DISABLE_PATCHES",
                       " cpu_expand_kernel ,infill_requests, spec_method_choices")
    vllm_anyorder.apply_front_end_patches()
    assert patches.applied() == {"method_names", "cpu_padded_drafts",  # no such kernel: no-op
                                 "v1_model_runner", "drafts_with_output",
                                 "cpu_greedy_verification", "cpu_sampled_verification"}
    # off the CPU (a logits tensor elsewhere) vLLM's own path
    device = SimpleNamespace(device=SimpleNamespace(type="cuda"))
    assert FakeRejectionSampler().forward(None, None, device, None) == "stock"
    assert FakeInputProcessor().process_inputs("r", None, None) == "stock"
    assert kernels._expand_kernel_impl is stock_kernel
    assert FakeEngineArgs.create_speculative_config is not stock
    # a non-dict speculative config goes straight to vLLM's method
    args = SimpleNamespace(speculative_config=None, additional_config={})
    assert FakeEngineArgs.create_speculative_config(args, None, None) == "stock"


def test_importing_the_package_imports_neither_torch_nor_vllm():
    result = run_python("""
        import json, sys
        import vllm_anyorder
        from vllm_anyorder import config, engine_setup, methods, patches, _compat
        from vllm_anyorder.core import jacobi
        config.parse("jacobi", {"num_blocks": 2}, block_size=8)  # validation stays light too
        heavy = sorted(m for m in sys.modules
                       if m.split(".")[0] in ("torch", "vllm", "numpy", "transformers"))
        print(json.dumps(heavy))
    """)
    assert result == []


def test_every_ledger_entry_documents_why_what_checked_remove():
    ledger = patches.describe()
    patch_functions = {
        f"{module.__name__}.{name}" for module in vars(patches).values()
        if isinstance(module, ModuleType) and module.__name__.startswith(patches.__name__ + ".")
        for name in dir(module) if name.startswith("apply_")
    }
    assert {f"{p.install.__module__}.{p.install.__name__}" for p in patches.LEDGER} == \
        patch_functions, "every patch function must have one LEDGER entry"
    assert len({e["name"] for e in ledger}) == len(ledger) == len(patch_functions)
    for entry in ledger:
        doc = entry["doc"] or ""
        for section in ("Why:", "What:", "Checked:", "Remove:"):
            assert section in doc, f"{entry['name']} lacks '{section}'"
        checked = doc.split("Checked:")[1].split("Remove:")[0]
        assert re.search(r"\b0\.3[23]\.0\b", checked), f"{entry['name']}: vLLM version checked"
        assert entry["why"] and entry["remove"], entry["name"]


def test_docs_patch_table_is_generated_from_the_ledger():
    from vllm_anyorder.patches.__main__ import DOC, render

    assert DOC.read_text() == render(), "run: python -m vllm_anyorder.patches --write"


def test_every_method_record_holds_its_config_proposer_and_startup_check():
    assert set(methods.METHODS) == set(config.CONFIG_CLASSES)
    for name, spec in methods.METHODS.items():
        assert spec.config is config.CONFIG_CLASSES[name], name
        for path in filter(None, (spec.proposer, spec.startup_check)):
            module, _, attr = path.rpartition(".")
            assert callable(getattr(importlib.import_module(module), attr)), path


def test_method_table_maps_jacobi_to_an_importable_proposer():
    spec = methods.METHODS["jacobi"]
    assert spec.name == "jacobi" and spec.target_family in ("autoregressive", "diffusion")
    assert "jacobi" in config.CONFIG_CLASSES
    module, _, cls_name = spec.proposer.rpartition(".")
    cls = getattr(importlib.import_module(module), cls_name)
    for attr in ("load_model", "propose", "observe_verification"):
        assert callable(getattr(cls, attr, None)), attr
    assert cls.method == "jacobi"
    assert methods.lookup("custom_class", spec.proposer) is spec
    assert methods.lookup(None, spec.proposer) is spec
    assert methods.lookup("ngram", None) is None
    assert methods.lookup("custom_class", "my.Other") is None


def test_console_script_is_declared_and_installed():
    eps = [ep for ep in metadata.entry_points(group="console_scripts")
           if ep.name == "vllm-anyorder"]
    assert [ep.value for ep in eps] == ["vllm_anyorder.cli:main"]
    assert console_script(), "vllm-anyorder is not on PATH nor next to the interpreter"


def test_console_script_reports_the_vllm_version(cli_version):
    assert cli_version, "vllm-anyorder console script not installed"
    out, err = cli_version.communicate(timeout=120)
    assert cli_version.returncode == 0, err[-3000:]
    assert re.search(r"\b0\.3[23]\.", out), out  # the CPU wheel is 0.32; GPU installs 0.32 or 0.33
