"""Prometheus metrics of the speculation budget, in vLLM's conventions (``vllm:`` names,
``model_name`` / ``engine`` labels, served on the server's ``/metrics``).

Registered through vLLM's stat-logger plugin group (``vllm.stat_logger_plugins`` entry point):
vLLM builds :class:`BudgetStatLogger` in the front-end process next to its own loggers and
hands it every engine step's ``SchedulerStats``. From vLLM's own per-step spec-decode stats
it counts engine steps, steps that verified no drafts, drafted and accepted tokens per step
(a histogram each). The controller's cost model lives in the workers: rank 0's budget writes
a small JSON snapshot (``budget_snapshot_path``) once a second, which ``log()`` turns into
gauges (draft rows chosen, seconds per extra row, the predicted gain over no drafts).
Engines without a plugin method get no metrics from it.

Metrics (counters end in ``_total`` on the wire):

* ``vllm:anyorder_budget_steps`` -- engine steps seen;
* ``vllm:anyorder_budget_steps_without_drafts`` -- steps in which no request had drafts;
* ``vllm:anyorder_budget_draft_tokens_per_step`` / ``..._accepted_tokens_per_step`` --
  histograms over steps;
* ``vllm:anyorder_budget_cost_slope_seconds_per_row``, ``..._draft_rows``,
  ``..._predicted_gain`` -- gauges from rank 0's controller.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def budget_snapshot_path(instance_id: str) -> str:
    """Where rank 0's controller leaves its state for the front-end (one per engine)."""
    return os.path.join(tempfile.gettempdir(), f"vllm-anyorder-budget-{instance_id}.json")


def _plugin_method(vllm_config: Any) -> bool:
    from vllm_anyorder import methods

    spec = getattr(vllm_config, "speculative_config", None)
    return spec is not None and methods.lookup(getattr(spec, "method", None),
                                               getattr(spec, "model", None)) is not None


def _stat_logger_base():
    from vllm.v1.metrics.loggers import StatLoggerBase

    return StatLoggerBase


class BudgetStatLogger:
    """vLLM stat logger (``StatLoggerBase`` interface; made a subclass in :func:`logger_class`)."""

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.enabled = _plugin_method(vllm_config)
        self.snapshot = budget_snapshot_path(getattr(vllm_config, "instance_id", "") or "default")
        self._labels = [vllm_config.model_config.served_model_name, str(engine_index)] \
            if self.enabled else []
        self._made = False

    def _ensure(self) -> None:
        """The metrics, made at the first record: vLLM builds its Prometheus logger after the
        plugin loggers and unregisters every ``vllm:`` collector first, ours included."""
        if self._made:
            return
        import prometheus_client as prom

        def make(kind, name, doc, **kw):
            metric = _metric(prom, kind, f"vllm:anyorder_budget_{name}", doc,
                             ["model_name", "engine"], **kw)
            return metric.labels(*self._labels)

        self.steps = make("Counter", "steps", "Engine steps seen by the speculation budget.")
        self.steps_without_drafts = make("Counter", "steps_without_drafts",
                                         "Engine steps in which no request had drafts.")
        self.drafted = make("Histogram", "draft_tokens_per_step",
                            "Draft tokens verified per engine step.", buckets=_BUCKETS)
        self.accepted = make("Histogram", "accepted_tokens_per_step",
                             "Draft tokens accepted per engine step.", buckets=_BUCKETS)
        self.slope = make("Gauge", "cost_slope_seconds_per_row",
                          "The cost model's seconds per extra verified row (rank 0).")
        self.rows = make("Gauge", "draft_rows",
                         "Draft rows the controller chose for its last step (rank 0).")
        self.gain = make("Gauge", "predicted_gain",
                         "Predicted tokens/s of the choice over no drafts (rank 0).")
        self._made = True

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        if not self.enabled or scheduler_stats is None:
            return
        self._ensure()
        spec = getattr(scheduler_stats, "spec_decoding_stats", None)
        drafted = spec.num_draft_tokens if spec is not None else 0
        self.steps.inc()
        if not drafted:
            self.steps_without_drafts.inc()
        self.drafted.observe(drafted)
        self.accepted.observe(spec.num_accepted_tokens if spec is not None else 0)

    def log(self) -> None:
        if not self.enabled:
            return
        self._ensure()
        try:
            with open(self.snapshot) as f:
                state = json.load(f)
        except (OSError, ValueError):
            return
        self.slope.set(state.get("cost_slope_s_per_row", 0.0))
        self.rows.set(state.get("last_rows", 0))
        self.gain.set(state.get("predicted_gain", 0.0))

    def log_engine_initialized(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass


_METRICS: dict[str, Any] = {}


def _metric(prom, kind: str, name: str, doc: str, labels: list[str], **kw):
    """One metric object per name and process (vLLM may build loggers more than once)."""
    if name not in _METRICS:
        _METRICS[name] = getattr(prom, kind)(name, doc, labelnames=labels, **kw)
    else:  # vLLM's Prometheus logger may have unregistered it: register it again
        try:
            prom.REGISTRY.register(_METRICS[name])
        except ValueError:  # still registered
            pass
    return _METRICS[name]


_CLASS: list[type] = []


def logger_class() -> type:
    """:class:`BudgetStatLogger` as a subclass of vLLM's ``StatLoggerBase`` (vLLM checks)."""
    if not _CLASS:
        _CLASS.append(type("AnyorderBudgetStatLogger", (BudgetStatLogger, _stat_logger_base()),
                           {"__module__": __name__}))
    return _CLASS[0]


def __getattr__(name: str):  # the entry point names ``vllm_anyorder.metrics:StatLogger``
    if name == "StatLogger":
        return logger_class()
    raise AttributeError(name)
