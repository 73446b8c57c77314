"""vllm-anyorder: lossless parallel decoding methods for vLLM, as a plugin.

``register()`` is the ``vllm.general_plugins`` entry point. vLLM calls it in every process
it starts (front-end, EngineCore, each worker, Ray actors; all spawned), so it is idempotent,
cheap, and touches no device. Importing this package imports neither torch nor vLLM.

Layers: ``core`` (engine-free algorithms) <- ``proposers`` / ``attention_backends`` /
``model_executor`` (thin vLLM adapters) <- ``register`` (this file). ``patches`` (the
ledger) sits at the bottom with ``_compat``: callers hand each patch what it needs.
"""

from __future__ import annotations

import os

__version__ = "0.1.0"
__all__ = ["register", "apply_front_end_patches", "__version__"]

_REGISTERED = False


def register() -> None:
    """Install the plugin into the current vLLM process (safe to call repeatedly)."""
    global _REGISTERED
    if _REGISTERED:
        return
    apply_front_end_patches()
    from vllm_anyorder import model_executor

    model_executor.register()  # every family's model class, HF config and engine settings
    _REGISTERED = True


def apply_front_end_patches() -> None:
    """The patches every process needs early, with what they need from the plugin's upper
    layers (the ledger itself imports nothing above ``_compat``)."""
    from vllm_anyorder import engine_setup, infill, methods, patches, runner_choice
    from vllm_anyorder.core import greedy_verify, sampled_verify

    patches.apply("method_names", on_speculative_config=engine_setup.on_speculative_config)
    patches.apply("spec_method_choices", method_names=tuple(methods.METHODS))
    patches.apply("v1_model_runner", needs_v1=runner_choice.needs_v1,
                  forced_v2_message=runner_choice.forced_v2_message)
    patches.apply("drafts_with_output")  # no second RPC per step for the drafts
    patches.apply("cpu_expand_kernel")
    patches.apply("cpu_padded_drafts")
    patches.apply("cpu_greedy_verification", greedy_verify=greedy_verify.greedy_verify)
    patches.apply("cpu_sampled_verification", sampled_verify=sampled_verify.sampled_verify)
    patches.apply("infill_requests", screen=infill.screen_request,
                  complete=infill.complete_request)
    if os.environ.get(patches.step_timing.ENV, "") == "1":
        patches.apply("step_timing")  # diagnostics: benchmarks/bench_floor.py
