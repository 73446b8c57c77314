"""Patches that tell the AS-ARM attention builder what vLLM's metadata lacks: prompt ends and
infill requests' true positions (worker processes, applied by the AS-ARM model classes)."""

from __future__ import annotations

import functools

from vllm_anyorder import _compat

def apply_asarm_prompt_lengths(prompt_lens) -> None:
    """Tell the AS-ARM attention builder where each request's prompt ends.

    Why: an AS-ARM attends bidirectionally over the prompt and causally after it. vLLM's
    metadata builders see query/sequence lengths but not prompt lengths, and two schedules
    put prompt and non-prompt rows in one request's rows: a preempted request recomputed as
    prompt + outputs, and vLLM's spec-decode padding, which schedules a 1-token prompt as
    ``[token, -1 x k]`` (``v1/core/sched/scheduler.py:1130-1153``). Treating such rows as one
    bidirectional prompt lets the prompt attend to the placeholders (seen: wrong first token).
    What: wraps ``GPUModelRunner._build_attention_metadata`` (inherited by the V1
    ``CPUModelRunner``): while it runs, ``attention_backends.asarm_attention.PROMPT_LENS`` holds
    ``input_batch.num_prompt_tokens_cpu_tensor`` (input-batch row order, the order of the
    metadata's requests), which only the AS-ARM builders (``AsArmBuilderMixin``) read. Nothing else changes.
    Applied by the AS-ARM model class when it is built (worker processes only).
    Checked: vLLM 0.32.0 (``v1/worker/gpu_model_runner.py:2249``, prompt lengths read at
    ``:2315``, called at ``:4142`` and ``:5751``; padding ``v1/core/sched/scheduler.py:1130``)
    and 0.33.0 (``:2253``, ``:2319``, ``:4108``, ``:5690``; ``scheduler.py:1307``).
    Remove: when ``CommonAttentionMetadata`` carries prompt lengths for every model (today
    only ``rswa_prefix_lens``, and only for R-SWA models, ``:2387-2389``).
    """
    cls = _compat.gpu_model_runner_cls()
    original = cls._build_attention_metadata

    @functools.wraps(original)
    def _build_attention_metadata(self, *args, **kwargs):
        batch = getattr(self, "input_batch", None)
        token = prompt_lens.set(getattr(batch, "num_prompt_tokens_cpu_tensor", None))
        try:
            return original(self, *args, **kwargs)
        finally:
            prompt_lens.reset(token)

    cls._build_attention_metadata = _build_attention_metadata


def apply_asarm_infill_positions(position_tables, batch_tables) -> None:
    """Tell the AS-ARM attention builder the true positions of infill requests' tokens.

    Why: an infill request (``vllm_anyorder.infill``) is served as prompt = visible tokens,
    generated tokens = masked positions in generation order; vLLM numbers both by sequence
    index, but the AS-ARM's rotary must use the true positions (content row i at
    ``table[i]``, its query row predicting ``table[i + 1]``), and vLLM has no per-request
    position override (M-RoPE's ``mrope_positions`` is tied to multimodal models).
    What: wraps ``GPUModelRunner._build_attention_metadata``: while it runs,
    ``attention_backends.asarm_positions.POSITION_TABLES`` holds each input-batch row's
    position table (from ``sampling_params.extra_args["anyorder_infill"]``, cached on the
    runner's request state) or None when no infill request is scheduled. Only
    the AS-ARM builders (``AsArmBuilderMixin``) read it; it stores the rows' true positions in the metadata
    and the AS-ARM model uses them for rotary. Slot mapping, sampling and bookkeeping stay
    by sequence index. The proposer reads the same tables for its drafting forward.
    Applied by the AS-ARM model class when it is built (worker processes only).
    Checked: vLLM 0.32.0 (``v1/worker/gpu_model_runner.py:2249``, called at ``:4142``
    and ``:5751``; ``CachedRequestState`` in ``v1/worker/gpu_input_batch.py:35``) and 0.33.0
    (``:2253``, ``:4108``, ``:5690``; ``gpu_input_batch.py:35``).
    Remove: when vLLM carries per-request position ids to the model, or with infill serving.
    """
    cls = _compat.gpu_model_runner_cls()
    original = cls._build_attention_metadata

    @functools.wraps(original)
    def _build_attention_metadata(self, *args, **kwargs):
        token = position_tables.set(batch_tables(self))
        try:
            return original(self, *args, **kwargs)
        finally:
            position_tables.reset(token)

    cls._build_attention_metadata = _build_attention_metadata
