"""Patches across the EngineCore / worker boundary (every process, applied by ``register()``)."""

from __future__ import annotations

import functools

from vllm_anyorder import _compat
from vllm_anyorder.contract import VerificationObserver, implements

# the attribute of ModelRunnerOutput that carries the step's drafts to the EngineCore
DRAFTS_ATTR = "anyorder_draft_token_ids"
_MISSING = object()


def apply_drafts_with_output() -> None:
    """Hand an anyorder proposer's drafts to the scheduler with the step's output.

    Why: in vLLM's synchronous schedule (the only one ``custom_class`` gets) the EngineCore
    asks the worker for the step's drafts in a second RPC after every step
    (``EngineCore.post_step`` -> ``executor.take_draft_token_ids``): one more round trip
    through the executor's message queue per step, drafts or not. On 2 CPU cores and a small
    model that round trip was 8.9% of the EngineCore's time (py-spy, ``jacobi`` with
    ``budget: cycle:0``), most of the 11% a speculative engine drafting nothing cost over no
    speculation: the budget's plain steps must not pay it.
    What: worker side, wraps ``GPUModelRunner.sample_tokens`` (inherited by the V1
    ``CPUModelRunner``): after a full step (it had ``execute_model_state``) whose drafter is a
    ``contract.VerificationObserver``, the returned ``ModelRunnerOutput`` gets the attribute
    ``anyorder_draft_token_ids`` = ``self.take_draft_token_ids()`` (what the RPC would have
    returned, read once the drafts exist). EngineCore side, wraps
    ``Scheduler.update_from_output`` to keep that attribute of the step's output (absent:
    nothing kept) and ``EngineCore.post_step`` to use it instead of the RPC, under vLLM's own
    condition (``check_for_draft_tokens``, synchronous scheduling, model executed): the same
    ``update_draft_token_ids`` call with the same drafts, skipped when every chain is empty
    (a plain step: scheduling a running request already reset its ``spec_token_ids`` to
    ``[]``, ``scheduler.py:876``, so vLLM's per-request loop would only write ``[]`` again).
    Any other output (async, a connector-only output, another drafter) takes vLLM's RPC as
    before.
    Checked: vLLM 0.32.0 (``v1/engine/core.py:689`` ``post_step``, the step at ``:660-687``;
    ``v1/core/sched/scheduler.py:2026`` ``update_from_output``, ``:2550``
    ``update_draft_token_ids``; ``v1/worker/gpu_model_runner.py:4304`` ``sample_tokens``,
    ``:4627`` ``take_draft_token_ids``; ``ModelRunnerOutput`` a plain dataclass, pickled
    with its ``__dict__`` by the executors' message queues and Ray); vLLM 0.33.0
    (``post_step`` ``:699``, ``update_from_output`` ``:2259``, ``update_draft_token_ids``
    ``:2862``, ``sample_tokens`` ``:4270``, ``take_draft_token_ids`` ``:4593``).
    Remove: when vLLM returns a synchronous drafter's drafts with the model output.
    """
    runner = _compat.gpu_model_runner_cls()
    output_cls = _compat.model_runner_output_cls()
    original_sample = runner.sample_tokens

    @functools.wraps(original_sample)
    def sample_tokens(self, *args, **kwargs):
        full_step = getattr(self, "execute_model_state", None) is not None
        output = original_sample(self, *args, **kwargs)
        if full_step and isinstance(output, output_cls) and \
                implements(getattr(self, "drafter", None), VerificationObserver):
            setattr(output, DRAFTS_ATTR, self.take_draft_token_ids())
        return output

    runner.sample_tokens = sample_tokens

    scheduler = _compat.scheduler_cls()
    original_update = scheduler.update_from_output

    @functools.wraps(original_update)
    def update_from_output(self, scheduler_output, model_runner_output, *args, **kwargs):
        self._anyorder_drafts = getattr(model_runner_output, DRAFTS_ATTR, _MISSING)
        return original_update(self, scheduler_output, model_runner_output, *args, **kwargs)

    scheduler.update_from_output = update_from_output

    core = _compat.engine_core_cls()
    original_post = core.post_step

    @functools.wraps(original_post)
    def post_step(self, model_executed: bool) -> None:
        drafts = getattr(self.scheduler, "_anyorder_drafts", _MISSING)
        self.scheduler._anyorder_drafts = _MISSING
        if drafts is _MISSING or not (self.check_for_draft_tokens and model_executed
                                      and not self.async_scheduling):
            return original_post(self, model_executed)
        if drafts is not None and any(drafts.draft_token_ids):
            self.scheduler.update_draft_token_ids(drafts)
        return None

    core.post_step = post_step
