"""Patches of vLLM's CPU fallbacks for its Triton kernels (every process; inert on GPU builds)."""

from __future__ import annotations

import functools

from vllm_anyorder import _compat

def apply_cpu_expand_kernel() -> None:
    """Fix vLLM's CPU fallback of ``expand_kernel`` for float tensors.

    Why: ``cpu_triton_utils._expand_kernel_impl`` passes its output through ``_ensure_int64``,
    which *copies* non-int64 tensors, so the C++ kernel writes into a temporary and
    ``expand_batch_to_tokens`` returns uninitialised memory for per-token temperature, top-k
    and top-p. ``apply_sampling_constraints`` then scales target logits by garbage and every
    speculative method on the CPU build samples from a wrong distribution at temperature > 0
    (greedy is unaffected). Reported upstream in docs/UPSTREAM.md.
    What: replaces the module attribute with a dtype-preserving torch implementation before
    the CPU platform registers its kernel overrides (``worker_base.init_worker`` loads general
    plugins first, then calls ``register_triton_kernel_overrides``). GPU builds never call it.
    Checked: vLLM 0.32.0 (``utils/cpu_triton_utils.py:390``, ``platforms/cpu.py:683-721``)
    and 0.33.0 (``:390``, ``platforms/cpu.py:709-747``; the GPU wheel ships the module, its
    GPU platform never registers it).
    Remove: once upstream writes into ``output`` in place for every dtype.
    """
    module = _compat.cpu_triton_utils()
    if module is None or not hasattr(module, "_expand_kernel_impl"):
        return

    def _expand_kernel_impl(
        output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None
    ):
        # output[cu[i-1]:cu[i]] = input[i] (with replace_from -> replace_to), any dtype.
        import torch

        counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1))
        values = torch.where(
            input_val == replace_from, torch.full_like(input_val, replace_to), input_val
        )
        total = int(counts.sum())
        output[:total] = torch.repeat_interleave(values, counts).to(output.dtype)

    module._expand_kernel_impl = _expand_kernel_impl


def apply_cpu_padded_drafts() -> None:
    """Make vLLM's CPU rejection kernel reject padded (-1) drafts, as the Triton kernel does.

    Why: the scheduler pads a request that joins running ones with one token left to compute
    (a 1-token prompt, a prefix-cache hit, a resumed request) to ``[token, -1 x k]``
    (``v1/core/sched/scheduler.py:1131``). The Triton ``rejection_random_sample_kernel``
    rejects a negative draft (``v1/sample/rejection_sampler.py:865``); the CPU build's C++
    ``rejection_random_sample_kernel_impl`` does not check: it reads draft/target
    probabilities at ``row * V - 1`` (the previous row's last entry, or out of bounds), may
    "accept" the -1, and then commits a token recovered at a later padded position (a
    distribution conditioned on a -1 input). Sampled requests then get wrong tokens and
    speculative methods lose exactness on CPU (ASSD at temperature > 0; Lemma 1 counts).
    What: wraps the module attribute before the CPU platform registers its kernel overrides:
    runs the C++ kernel with negative drafts clamped to 0, then for every non-greedy request
    whose first negative draft j was reached (output[j] written, i.e. nothing rejected
    before j) sets output[j] to the recovered token of position j and clears the rest,
    exactly the Triton kernel's result. Batches without negative drafts are untouched.
    Checked: vLLM 0.32.0 (``utils/cpu_triton_utils.py:346``, ``platforms/cpu.py:683-721``)
    and 0.33.0 (``:346``, ``platforms/cpu.py:709-747``; Triton kernel's -1 check at
    ``v1/sample/rejection_sampler.py:932``).
    Remove: once the C++ kernel rejects ``draft_token_id < 0``.
    """
    module = _compat.cpu_triton_utils()
    if module is None or not hasattr(module, "_rejection_random_sample_kernel_impl"):
        return
    import inspect

    original = module._rejection_random_sample_kernel_impl
    signature = inspect.signature(original)

    @functools.wraps(original)
    def _rejection_random_sample_kernel_impl(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        a = bound.arguments
        drafts = a["draft_token_ids"]
        negative = drafts < 0
        if not bool(negative.any()):
            return original(*bound.args, **bound.kwargs)
        a["draft_token_ids"] = drafts.clamp(min=0)
        original(*bound.args, **bound.kwargs)
        out, recovered, greedy = a["output_token_ids"], a["recovered_token_ids"], a["is_greedy"]
        ends = a["cu_num_draft_tokens"].tolist()
        start = 0
        for req, end in enumerate(ends):
            first = negative[start:end].nonzero()
            if len(first) and not (greedy is not None and bool(greedy[req])):
                j = int(first[0])
                if int(out[req, j]) != -1:  # position j reached: nothing rejected before
                    out[req, j] = recovered[start + j]
                    out[req, j + 1:] = -1
            start = end

    module._rejection_random_sample_kernel_impl = _rejection_random_sample_kernel_impl


def apply_cpu_greedy_verification(greedy_verify) -> None:
    """Verify an all-greedy step's drafts on the CPU build without vLLM's Triton-kernel path.

    Why: at temperature 0 the rejection sampler's work is an argmax per row and a prefix
    match (``core/greedy_verify``), but on the CPU build it runs the full bonus ``Sampler``,
    copies the target rows to float32 and launches ``rejection_greedy_sample_kernel``
    through the Python Triton dispatcher: ~0.6-0.75 ms of every drafting step at batch 1
    (2-core AMD EPYC, fp32: 8% of a step, a fixed price on every drafting step of every
    method), against ~0.15 ms for the same rule on plain integers (issue 22).
    What: wraps ``RejectionSampler.forward``: for a step whose logits are on the CPU, whose
    requests are all greedy, with no logprobs, penalties, bad words, allowed-token mask,
    argmax-changing logits processor at work (``min_tokens``), thinking budget or synthetic
    acceptance, it takes one argmax over the step's logits and applies ``greedy_verify``
    (handed in by the caller: ``core.greedy_verify``, vLLM's greedy kernel's rule, the same
    tokens); every other step runs vLLM's own path.
    Checked: vLLM 0.32.0 (``v1/sample/rejection_sampler.py:106`` forward, ``:477`` greedy
    branch, ``:726`` kernel; ``v1/sample/sampler.py:97-103`` the bonus token's float32
    argmax) and 0.33.0 (same functions; the GPU build never takes this path: its logits are
    on the GPU).
    Remove: when vLLM's CPU build verifies greedy drafts without the Triton dispatcher.
    """
    import torch  # at install, not in every step (vLLM has imported it by then)

    cls = _compat.rejection_sampler_cls()
    output_cls = _compat.sampler_output_cls()
    original = cls.forward

    @functools.wraps(original)
    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        if logits is None or logits.device.type != "cpu" or \
                not _plain_greedy(self, sampling_metadata):
            return original(self, metadata, draft_probs, logits, sampling_metadata)
        argmax = logits.argmax(dim=-1).tolist()  # float32 casts of the rows are exact
        target = [argmax[i] for i in metadata.target_logits_indices.tolist()]
        bonus = [argmax[i] for i in metadata.bonus_logits_indices.tolist()]
        rows = greedy_verify(metadata.draft_token_ids.tolist(), list(metadata.num_draft_tokens),
                             target, bonus, metadata.max_spec_len + 1)
        return output_cls(sampled_token_ids=torch.tensor(rows, dtype=torch.int32),
                          logprobs_tensors=None)

    cls.forward = forward


def _plain_greedy(sampler, meta) -> bool:
    """Whether vLLM's rejection sampler would only take argmaxes in this step (the bonus
    ``Sampler`` and the target rows alike): every request greedy, and nothing that changes
    logits before the argmax or asks for more than the tokens."""
    return bool(meta.all_greedy) and _plain_sampling(sampler, meta)


def _inert(processor) -> bool:
    """An argmax-changing logits processor that changes nothing in this step: vLLM builds a
    ``MinTokensLogitsProcessor`` for every engine, a no-op while no request has a
    ``min_tokens`` left to reach (its ``min_toks`` is empty)."""
    return type(processor).__name__ == "MinTokensLogitsProcessor" and \
        not getattr(processor, "min_toks", True)


def apply_cpu_sampled_verification(sampled_verify) -> None:
    """Verify a sampled step's drafts on the CPU build without vLLM's Triton-kernel path.

    Why: at temperature > 0 vLLM's rejection sampler runs the full bonus ``Sampler`` on every
    request, copies and clones the target rows, scales them through the ``expand`` kernel,
    softmaxes them, draws one exponential row a request, and launches the recovered-token and
    rejection kernels through the Python Triton dispatcher: on a 2-core AMD EPYC (Zen 4, one
    thread, V 4096) 0.47 ms at batch 1 with 4 drafts and 1.5-2.2 ms at batch 8 with 2-4
    (against 0.05-0.4 ms for the plain ``Sampler``), a fixed price on every drafting step of
    every method at T > 0 that the speculation budget must then beat (issue 22).
    What: wraps ``RejectionSampler.forward``: for a step whose logits are on the CPU, with
    some request sampled, no logprobs, penalties, bad words, allowed-token mask, active
    logits processor (``min_tokens``; vLLM builds no other for a speculative engine),
    thinking budget or synthetic acceptance, it scales each row by its request's temperature,
    applies vLLM's own ``apply_top_k_top_p`` and applies ``sampled_verify`` to the rows
    (handed in by the caller: ``core.sampled_verify``, the rule of vLLM's kernels; greedy
    requests of a mixed step by argmax; a seeded request draws from its own generator, as in
    vLLM). Same distribution of every committed token, not the same random draws (given the
    same drafts a seed reproduces its output on this path, not vLLM's); every other step runs
    vLLM's own path.
    Checked: vLLM 0.32.0 (``v1/sample/rejection_sampler.py:106`` forward, ``:410``
    ``rejection_sample``, ``:522`` constraints, ``:678`` recovered tokens, ``:829`` kernel;
    ``v1/sample/sampler.py:247`` the bonus ``sample``) and 0.33.0 (same functions; the GPU
    build never takes this path: its logits are on the GPU).
    Remove: when vLLM's CPU build verifies sampled drafts without the Triton dispatcher.
    """
    import torch

    cls = _compat.rejection_sampler_cls()
    output_cls = _compat.sampler_output_cls()
    original = cls.forward

    @functools.wraps(original)
    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        meta = sampling_metadata
        if logits is None or logits.device.type != "cpu" or meta.all_greedy or \
                meta.logitsprocs.argmax_invariant or not _plain_sampling(self, meta):
            return original(self, metadata, draft_probs, logits, sampling_metadata)
        counts = list(metadata.num_draft_tokens)
        target_rows = metadata.target_logits_indices.tolist()
        bonus_rows = metadata.bonus_logits_indices.tolist()
        request = [0] * logits.shape[0]  # row -> its request
        for row, i in zip(target_rows, (i for i, n in enumerate(counts) for _ in range(n))):
            request[row] = i
        for i, row in enumerate(bonus_rows):
            request[row] = i
        temperature = meta.temperature.tolist()
        greedy = [t == 0 for t in temperature]
        scale = [temperature[i] or 1.0 for i in request]  # greedy rows: argmax below
        scaled = logits.to(torch.float32)
        scaled = scaled / scale[0] if len(set(scale)) == 1 else \
            scaled / torch.tensor(scale).unsqueeze(1)
        drawn = _seeded_without_drafts(self, meta, counts, greedy, scaled, bonus_rows)
        if meta.top_k is not None or meta.top_p is not None:  # masks in place
            at = torch.tensor(request)
            scaled = _compat.apply_top_k_top_p(
                scaled, None if meta.top_k is None else meta.top_k[at],
                None if meta.top_p is None else meta.top_p[at])
        argmax = logits.argmax(dim=-1).tolist() if any(greedy) else None
        rows = sampled_verify(metadata.draft_token_ids, counts, scaled, greedy,
                              argmax=argmax, draft_probs=draft_probs, target_rows=target_rows,
                              bonus_rows=bonus_rows, generators=meta.generators, drawn=drawn)
        return output_cls(sampled_token_ids=torch.tensor(rows, dtype=torch.int32),
                          logprobs_tensors=None)

    cls.forward = forward


def _seeded_without_drafts(sampler, meta, counts, greedy, tempered, bonus_rows) -> dict:
    """Request -> token for the seeded sampled requests without drafts in this step, drawn by
    vLLM's own bonus sampler (``TopKTopPSampler``) from copies of their tempered rows (before
    top-k / top-p, which the sampler applies), as on a step where no request drafts: such a
    request takes the same from its generator whether or not others drafted (vLLM's rule
    too), so a seed reproduces its output however the batch was formed."""
    chosen = [i for i in meta.generators if not counts[i] and not greedy[i]]
    if not chosen:
        return {}
    import torch  # (only for steps with such a request)

    at = torch.tensor(chosen)
    tokens, _ = sampler.sampler.topk_topp_sampler(
        tempered[[bonus_rows[i] for i in chosen]],
        {k: meta.generators[i] for k, i in enumerate(chosen)},
        None if meta.top_k is None else meta.top_k[at],
        None if meta.top_p is None else meta.top_p[at])
    return dict(zip(chosen, tokens.tolist()))


def _plain_sampling(sampler, meta) -> bool:
    """Whether nothing but temperature, top-k and top-p shapes this step's distributions and
    nothing beyond the tokens is asked for (the conditions of :func:`_plain_greedy` less
    ``all_greedy``)."""
    holder = getattr(meta, "thinking_budget_state_holder", None)
    return not getattr(sampler, "synthetic_mode", False) \
        and meta.max_num_logprobs is None and not getattr(meta, "logprob_token_ids", None) \
        and meta.no_penalties and not meta.bad_words_token_ids \
        and meta.allowed_token_ids_mask is None \
        and all(_inert(p) for p in meta.logitsprocs.non_argmax_invariant) \
        and (holder is None or not holder.has_tracked_requests())
