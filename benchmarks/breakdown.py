"""Worker-side timers for ``bench_breakdown.py``: where an engine step's time goes.

``install(worker)`` (sent with ``llm.collective_rpc``) wraps instance methods of the worker's
model runner, its model, its drafter and the plugin's runner patches with ``perf_counter``
frames on one stack. Each frame has a category; a frame's *exclusive* time (minus its
child frames) is added to that category, so nested frames are never counted twice:

* ``target_fwd`` -- item 1: a model forward (``forward``, ``compute_logits``, and the
  plugin models' ``row_logits`` / ``query_logits``; specdiff's ``token_logits``) whose
  nearest enclosing frame is vLLM code: vLLM's forward over the scheduled tokens.
* ``draft_fwd`` -- item 2: a model forward entered from plugin code (specdiff's drafter,
  assd's query-stream ``query_logits``, the dLLM node / repair ``row_logits``) or from
  vLLM's own drafter (``draft_model``: its drafter model's forwards).
* ``plugin`` -- item 3: time inside the plugin's ``propose`` / ``observe_verification`` /
  ``take_draft_probs`` and inside the bodies of the ``vllm_anyorder.patches`` wrappers of
  runner methods (``_sample``, ``propose_draft_token_ids``, ``_get_spec_decode_draft_probs``,
  ``_build_attention_metadata``), minus forwards and minus the vLLM originals they call
  (those are re-tagged ``vllm_inner`` by swapping the wrapper's closure cell).
* ``kv_copy`` -- part of item 3: ``attention_backends.dllm_plans.scratch_plan`` (scratch
  blocks allocated and zeroed, the requests' prefix KV blocks copied into them, the node
  rows' attention metadata), the dLLM rows' per-round KV copy.
* ``rule`` -- part of item 3: ``core.dllm_blocks.row_scores``, the dLLM decision rule's
  vocabulary math (argmax and float64 softmax of every masked row a step reads: the dLLM's
  sampler, the same math LLaDA's ``generate`` does per step).
* ``vllm_drafter`` -- vLLM's own drafter ``propose`` (ngram lookup, draft_model input prep),
  minus its forwards; part of item 4.
* ``worker`` -- the rest of ``execute_model`` + ``sample_tokens`` (input prep, attention
  metadata, sampling, rejection sampler, bookkeeping); ``vllm_inner`` likewise. Both part of
  item 4; the remainder of the wall clock (scheduler, front end, IPC) is item 4 as well.

``read(worker)`` returns the seconds and call counts since the last ``reset(worker)``;
steps = ``execute_model`` calls with scheduled tokens (``empty_steps``: calls with none, which
only update the runner's state). Wrappers stay installed for the engine's life.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict

FORWARD_METHODS = ("forward", "compute_logits", "row_logits", "query_logits", "token_logits")
RUNNER_PATCHED = ("_sample", "propose_draft_token_ids", "_get_spec_decode_draft_probs",
                  "_build_attention_metadata")
PLUGIN_HOOKS = ("propose", "observe_verification", "take_draft_probs")
# plugin internals timed as "plugin" frames too: only ``by_function`` (the detail) changes
PLUGIN_DETAIL = ("_decide", "_draft_self", "_sample_drafts", "_draft_ngram")
_DECIDES = {"plugin": "draft_fwd", "vllm_drafter": "draft_fwd", "draft_fwd": "draft_fwd",
            "target_fwd": "target_fwd", "vllm_inner": "target_fwd", "worker": "target_fwd"}

_stack: list[list] = []  # frames [category, child seconds]
SECONDS: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)
BY_FUNCTION: dict[str, float] = defaultdict(float)  # "category: function" -> exclusive s
_installed: list[str] = []


def _category(cat: str) -> str:
    if cat != "fwd":
        return cat
    for frame in reversed(_stack):  # the nearest frame that says who called the forward
        if frame[0] in _DECIDES:
            return _DECIDES[frame[0]]
    return "target_fwd"


def timed(fn, cat: str, count: str | None = "", label: str = ""):
    """``fn`` with a frame of category ``cat`` ("fwd": target or draft, decided per call);
    a call is counted under ``count`` (default: the category; None: not counted), only when
    it is not nested in a frame of the same category (a forward inside a forward)."""
    label = label or getattr(fn, "__qualname__", repr(fn))

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        frame = [_category(cat), 0.0]
        if count is not None and not (_stack and _stack[-1][0] == frame[0]):
            CALLS[count or frame[0]] += 1
        _stack.append(frame)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            _stack.pop()
            SECONDS[frame[0]] += dt - frame[1]
            BY_FUNCTION[f"{frame[0]}: {label}"] += dt - frame[1]
            if _stack:
                _stack[-1][1] += dt

    wrapper._breakdown = True
    return wrapper


def _wrap_attr(obj, name: str, cat: str, count: str | None = "") -> bool:
    fn = getattr(obj, name, None)
    if fn is None or not callable(fn) or getattr(fn, "_breakdown", False):
        return False
    if name == "compute_logits":  # the logits of a forward already counted
        count = None
    setattr(obj, name, timed(fn, cat, count))
    return True


def _is_patch(fn) -> bool:
    """A wrapper defined in the vllm_anyorder/patches package (``functools.wraps`` copied the
    wrapped function's ``__module__``, so ask its code object)."""
    code = getattr(fn, "__code__", None)
    return hasattr(fn, "__wrapped__") and code is not None and \
        "vllm_anyorder/patches/" in code.co_filename.replace("\\", "/")


def _retag_inner(fn) -> None:
    """In a patch wrapper (class level, shared), re-tag the function it wraps: its
    closure cell holding ``__wrapped__`` gets a frame ("plugin" for another patch wrapper,
    whose body is plugin code too, else "vllm_inner"). Recurses down a chain of wrappers."""
    inner = fn.__wrapped__
    for cell in fn.__closure__ or ():
        try:
            contents = cell.cell_contents
        except ValueError:
            continue
        if contents is inner:
            cell.cell_contents = timed(inner, "plugin" if _is_patch(inner) else "vllm_inner")
            break
    if _is_patch(inner):
        _retag_inner(inner)


def install(worker) -> list[str]:
    """Wrap the runner, its model and drafter (idempotent per process); what was wrapped."""
    if _installed:
        return list(_installed)
    runner = worker.model_runner
    done = []
    if _wrap_attr(runner, "sample_tokens", "worker", None):
        execute = timed(runner.execute_model, "worker", None)

        def execute_model(*args, **kwargs):  # steps: calls with scheduled tokens
            so = args[0] if args else kwargs.get("scheduler_output")
            busy = getattr(so, "total_num_scheduled_tokens", 1) > 0
            CALLS["steps" if busy else "empty_steps"] += 1
            return execute(*args, **kwargs)

        runner.execute_model = execute_model
        done += ["runner.execute_model", "runner.sample_tokens"]
    for name in FORWARD_METHODS:
        if _wrap_attr(runner.model, name, "fwd"):
            done.append(f"model.{name}")
    for name in RUNNER_PATCHED:
        cls_fn = getattr(type(runner), name, None)
        if cls_fn is not None and _is_patch(cls_fn):
            _retag_inner(cls_fn)
            _wrap_attr(runner, name, "plugin")
            done.append(f"runner.{name} (plugin patch)")
    drafter = getattr(runner, "drafter", None)
    if drafter is not None:
        ours = type(drafter).__module__.startswith("vllm_anyorder")
        for name in PLUGIN_HOOKS if ours else ("propose",):
            if _wrap_attr(drafter, name, "plugin" if ours else "vllm_drafter"):
                done.append(f"drafter.{name}")
        for name in PLUGIN_DETAIL if ours else ():
            if _wrap_attr(drafter, name, "plugin"):
                done.append(f"drafter.{name} (detail)")
        sub = getattr(drafter, "drafter" if ours else "model", None)  # specdiff / draft_model
        if sub is not None and sub is not runner.model:
            for name in FORWARD_METHODS:
                if _wrap_attr(sub, name, "fwd"):
                    done.append(f"drafter model.{name}")
    if type(drafter).__module__ == "vllm_anyorder.proposers.dllm":
        from vllm_anyorder.attention_backends import dllm_plans
        from vllm_anyorder.core import dllm, dllm_blocks, dllm_scores
        from vllm_anyorder.core.dllm import DllmRequest

        if _wrap_attr(dllm_plans, "scratch_plan", "kv_copy"):  # looked up at each call
            done.append("dllm_plans.scratch_plan (cpu_op only)")
        if _wrap_attr(dllm_blocks, "row_scores", "rule"):  # both modules' names: one wrapper
            dllm_scores.row_scores = dllm_blocks.row_scores
            done.append("dllm_blocks.row_scores (rule)")
        if _wrap_attr(dllm, "prefetch", "plugin"):
            done.append("dllm.prefetch (detail)")
        for name in ("evaluate", "repair"):  # the dLLM forwards over the paged cache
            if _wrap_attr(drafter.rows, name, "plugin"):
                done.append(f"drafter.rows.{name} (detail)")
        for name in ("plan", "advance"):  # the core's decisions (class level: per request)
            if _wrap_attr(DllmRequest, name, "plugin"):
                done.append(f"DllmRequest.{name} (detail)")
    _installed.extend(done)
    return done


def reset(worker=None) -> None:
    SECONDS.clear()
    CALLS.clear()
    BY_FUNCTION.clear()


def read(worker=None) -> dict:
    """Seconds per category and call counts since the last reset (``steps``: execute_model
    calls with scheduled tokens; ``target_fwd`` / ``draft_fwd``: outermost forward calls)."""
    return {"seconds": dict(SECONDS), "calls": dict(CALLS), "by_function": dict(BY_FUNCTION)}
