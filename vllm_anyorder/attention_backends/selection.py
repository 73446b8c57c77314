"""Which attention implementation the plugin's models use: ``VLLM_ANYORDER_ATTENTION``.

* ``torch``: the device-agnostic PyTorch implementation (``torch_backend.py``), any device;
* ``cpu_op``: vLLM's CPU attention op (``asarm_cpu.py``, ``dllm_cpu.py``); refused at
  start-up off vLLM's CPU platform;
* ``auto`` (default): ``torch`` wherever the CPU op cannot serve (any platform but CPU), on
  CPU the faster of the two for the family, by measurement (:data:`AUTO_ON_CPU`,
  ``benchmarks/RESULTS.md``).

The XLNet AS-ARM always uses ``torch``: its relative-position scores have no CPU-op form.
The front end validates the choice while vLLM builds the engine config
(``model_executor/engine_configs.py``); each model class asks
:func:`backend_for` in the worker and logs one line naming the implementation.
Imports neither torch nor vLLM at module level.
"""

from __future__ import annotations

import importlib
import logging
import os

# a child of vLLM's logger: printed with vLLM's own handler and level (VLLM_LOGGING_LEVEL)
logger = logging.getLogger("vllm.anyorder")

ENV = "VLLM_ANYORDER_ATTENTION"
CHOICES = ("auto", "torch", "cpu_op")
# (attention kind, implementation) -> backend class
BACKENDS = {
    ("asarm", "cpu_op"): "vllm_anyorder.attention_backends.asarm_cpu:AsArmCPUBackend",
    ("asarm", "torch"): "vllm_anyorder.attention_backends.asarm_torch:AsArmTorchBackend",
    ("xlnet", "torch"): "vllm_anyorder.attention_backends.asarm_torch:AsArmTorchBackend",
    ("dllm", "cpu_op"): "vllm_anyorder.attention_backends.dllm_cpu:DllmCPUBackend",
    ("dllm", "torch"): "vllm_anyorder.attention_backends.dllm_torch:DllmTorchBackend",
}
# ``auto`` on vLLM's CPU platform, per kind (measured: benchmarks/RESULTS.md, "attention")
AUTO_ON_CPU = {"asarm": "cpu_op", "xlnet": "torch", "dllm": "cpu_op"}
_logged: set[tuple[str, str]] = set()


def requested() -> str:
    """The user's choice (``auto`` when unset); ValueError for anything else."""
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(CHOICES)}")
    return value


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def implementation(kind: str, on_cpu: bool | None = None) -> str:
    """The implementation a model of ``kind`` (asarm | xlnet | dllm) uses here."""
    choice = requested()
    on_cpu = _on_cpu() if on_cpu is None else on_cpu
    if choice == "cpu_op" and not on_cpu:
        raise ValueError(f"{ENV}=cpu_op: vLLM's CPU attention op runs on vLLM's CPU platform "
                         f"only; use {ENV}=torch or auto on this device")
    if kind == "xlnet" or (choice == "auto" and not on_cpu):
        return "torch"
    return AUTO_ON_CPU[kind] if choice == "auto" else choice


def backend_for(kind: str, model: str) -> type:
    """The attention backend class for ``model`` (a plugin model of ``kind``); registers the
    torch backend's name with vLLM when it is used; logs the choice once per process."""
    impl = implementation(kind)
    if impl == "torch":
        from vllm_anyorder.attention_backends import torch_backend

        torch_backend.register()
    if (model, impl) not in _logged:
        _logged.add((model, impl))
        why = " (XLNet's relative scores)" if kind == "xlnet" and requested() == "cpu_op" else ""
        logger.info("anyorder attention: %s%s [%s]", impl, why, model)
    module, name = BACKENDS[(kind, impl)].split(":")
    return getattr(importlib.import_module(module), name)
