"""Which of vLLM's two model runners a configuration needs: the plugin runs on the V1 runner.

vLLM 0.32 / 0.33 pick a worker's model runner from ``VllmConfig.use_v2_model_runner``:
``VLLM_USE_V2_MODEL_RUNNER`` when set, V2 when HiSparse or watermarking is configured,
else V2 (``v1/worker/gpu/``) wherever Triton is present (every GPU install) unless
``_get_v2_model_runner_unsupported_features`` lists something, and ``custom_class`` is
listed. The plugin's runner patches (``verification_hook``, ``draft_probs``,
``asarm_prompt_lens``, ``asarm_infill_positions``) and its attention builders target the
V1 runner (``v1/worker/gpu_model_runner.py``). A plugin method always runs as
``custom_class``; a plugin model family (AS-ARM, dLLM) served without a speculative config
would not be, so on a GPU it would get V2 and skip the patches. Patch ``v1_model_runner``
asks :func:`needs_v1` in every process: a configuration it names joins vLLM's own list of
what V2 does not support (V1 is chosen, with vLLM's warning), and one that V2 is forced on
is refused with :func:`forced_v2_message`. Imports neither torch nor vLLM.
"""

from __future__ import annotations

import os
from typing import Any

from vllm_anyorder import families, methods

ENV = "VLLM_USE_V2_MODEL_RUNNER"


def needs_v1(vllm_config: Any) -> str | None:
    """What in ``vllm_config`` needs the V1 model runner (a phrase for vLLM's "Model Runner
    V2 does not yet support ..." list), or None when nothing of the plugin's is in it."""
    model_config = getattr(vllm_config, "model_config", None)
    family = families.family_of(getattr(model_config, "hf_config", None))
    if family is not None:
        return f"vllm-anyorder's {family.architecture} models"
    spec = getattr(vllm_config, "speculative_config", None)
    method = methods.lookup(getattr(spec, "method", None), getattr(spec, "model", None))
    if method is not None:
        return f"vllm-anyorder's method '{method.name}'"
    return None


def forced_v2_message(reason: str, vllm_config: Any) -> str:
    """The start-up error when V2 is forced on a configuration that needs V1."""
    forced_by, fixes = [], []
    if os.environ.get(ENV):
        forced_by.append(f"{ENV}={os.environ[ENV]}")
        fixes.append(f"unset {ENV} (or set it to 0)")
    attention = getattr(vllm_config, "attention_config", None)
    if getattr(attention, "hisparse_config", None) is not None:
        forced_by.append("a HiSparse attention config")
        fixes.append("remove the HiSparse config")
    if getattr(vllm_config, "watermark_config", None) is not None:
        forced_by.append("a watermark config")
        fixes.append("remove the watermark config")
    return (f"{reason}: only vLLM's V1 model runner is supported (the plugin's runner hooks "
            f"and attention builders are written for it), but the V2 model runner is forced "
            f"by {' and '.join(forced_by) or 'the configuration'}; "
            f"{' and '.join(fixes) or f'set {ENV}=0'}")
