"""The model families the plugin serves: one table, read by everything that needs their facts.

A family is a Hugging Face architecture the plugin adds to vLLM: which vLLM model class runs
it, which engine settings it needs (vLLM's per-architecture ``MODELS_CONFIG_MAP`` hook), what
kind of decoding it supports and, for diffusion LLMs, the logit convention. Registration
(``model_executor.register``), the methods' start-up checks, the infill check and the
dLLM proposer all read :data:`FAMILIES`. Imports neither torch nor vLLM.

Adding a family: one row here, its vLLM model class (``model_executor/``), its Hugging Face
config class (``model_executor/hf_configs.py``); see ``docs/ARCHITECTURE.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

_EXECUTOR = "vllm_anyorder.model_executor"


@dataclass(frozen=True)
class ModelFamily:
    architecture: str  # config.json "architectures"[0]
    model_type: str  # config.json "model_type"
    kind: str  # "asarm": any-subset AR (assd, infill) | "dllm": diffusion LLM (stepwise, ...)
    model_class: str  # "module:Class" of the vLLM model class
    engine_config: str  # "module:Class" of its MODELS_CONFIG_MAP hook (engine settings)
    logit_shift: int = 0  # dLLM: 1 if row i's logits predict token i + 1 (Dream)


FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily("AnySubsetLlamaForCausalLM", "anyorder_llama", "asarm",
                f"{_EXECUTOR}.asarm_vllm:AnySubsetLlamaForCausalLM",
                f"{_EXECUTOR}.engine_configs:AsArmEngineConfig"),
    ModelFamily("XLNetLMHeadModel", "xlnet", "asarm",
                f"{_EXECUTOR}.xlnet_vllm:XLNetAnySubsetLM",
                f"{_EXECUTOR}.engine_configs:XLNetEngineConfig"),
    ModelFamily("LLaDAModelLM", "llada", "dllm", f"{_EXECUTOR}.dllm_vllm:LLaDAForDiffusionLM",
                f"{_EXECUTOR}.engine_configs:DllmEngineConfig", logit_shift=0),
    ModelFamily("DreamModel", "Dream", "dllm", f"{_EXECUTOR}.dllm_vllm:DreamForDiffusionLM",
                f"{_EXECUTOR}.engine_configs:DllmEngineConfig", logit_shift=1),
)
BY_ARCHITECTURE: dict[str, ModelFamily] = {f.architecture: f for f in FAMILIES}

# Diffusion formats that are not left-to-right AR but that vLLM does not serve as targets
# (SpecDiff drafters, other dLLMs): an AR method must refuse them too.
OTHER_DIFFUSION_ARCHITECTURES = frozenset(
    {"LLaDAMoEModelLM", "MDLM", "SEDD", "DiffusionGemmaForBlockDiffusion"})
OTHER_DIFFUSION_MODEL_TYPES = frozenset({"mdlm", "sedd"})


def architectures(kind: str) -> tuple[str, ...]:
    return tuple(f.architecture for f in FAMILIES if f.kind == kind)


def family_of(hf_config) -> ModelFamily | None:
    """The served family of a Hugging Face config, by its architectures."""
    for arch in getattr(hf_config, "architectures", None) or []:
        if arch in BY_ARCHITECTURE:
            return BY_ARCHITECTURE[arch]
    return None


def is_asarm(hf_config) -> bool:
    """Whether a Hugging Face config describes an AS-ARM checkpoint vLLM can serve."""
    family = family_of(hf_config)  # (the plugin's own model type counts without architectures)
    return (family is not None and family.kind == "asarm") or \
        getattr(hf_config, "model_type", None) == "anyorder_llama"


def is_diffusion(architectures_: list[str] | None, model_type: str | None) -> bool:
    """Whether a model is not left to right (a served dLLM or another diffusion format)."""
    archs = set(architectures_ or [])
    types = {f.model_type.lower() for f in FAMILIES if f.kind == "dllm"}
    return bool(archs & (set(architectures("dllm")) | OTHER_DIFFUSION_ARCHITECTURES)) or \
        (model_type or "").lower() in types | OTHER_DIFFUSION_MODEL_TYPES


def dllm_shape_of(hf_config) -> tuple[int, int | None, int] | None:
    """(mask id, eos id, logit shift) of a served dLLM config, or None if it is not one."""
    family = family_of(hf_config)
    if family is None or family.kind != "dllm":
        return None
    return int(hf_config.mask_token_id), getattr(hf_config, "eos_token_id", None), \
        family.logit_shift
