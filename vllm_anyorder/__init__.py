"""vllm-anyorder: lossless parallel decoding methods for vLLM, as a plugin.

``register()`` is the ``vllm.general_plugins`` entry point. vLLM calls it in every process
it starts (front-end, EngineCore, each worker, Ray actors; all spawned), so it is idempotent,
cheap, and touches no device. Importing this package imports neither torch nor vLLM.

Layers: ``core`` (engine-free algorithms) <- ``proposers`` / ``attention_backends`` /
``model_executor`` (thin vLLM adapters) <- ``register`` (this file) + ``patches`` (ledger).
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["register", "__version__"]

_REGISTERED = False


def register() -> None:
    """Install the plugin into the current vLLM process (safe to call repeatedly)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from vllm_anyorder import patches

    patches.apply_front_end_patches()
    from vllm_anyorder.model_executor import asarm_engine

    asarm_engine.register()  # AS-ARM (anyorder_llama) model class, config, engine settings
    from vllm_anyorder.model_executor import dllm_engine

    dllm_engine.register()  # LLaDA / Dream model classes, configs, engine settings
    _REGISTERED = True
