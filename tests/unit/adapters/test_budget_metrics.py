"""The budget's Prometheus metrics (vllm_anyorder/metrics.py): a vLLM stat-logger plugin."""

import json
from types import SimpleNamespace as NS

import pytest

from vllm_anyorder import metrics

JACOBI = "vllm_anyorder.proposers.jacobi.JacobiProposer"


def config(method="custom_class", model=JACOBI, instance="unit-test"):
    return NS(speculative_config=NS(method=method, model=model), instance_id=instance,
              model_config=NS(served_model_name="m"))


def value(name, **labels):
    import prometheus_client

    return prometheus_client.REGISTRY.get_sample_value(name, {"model_name": "m",
                                                              "engine": "0", **labels})


def test_the_entry_point_gives_a_vllm_stat_logger():
    pytest.importorskip("vllm")
    from vllm.v1.metrics.loggers import StatLoggerBase, load_stat_logger_plugin_factories

    assert any(issubclass(f, metrics.BudgetStatLogger) and issubclass(f, StatLoggerBase)
               for f in load_stat_logger_plugin_factories())


def test_steps_without_drafts_and_per_step_histograms(tmp_path, monkeypatch):
    pytest.importorskip("prometheus_client")
    monkeypatch.setattr(metrics.tempfile, "gettempdir", lambda: str(tmp_path))
    logger = metrics.logger_class()(config())
    before = value("vllm:anyorder_budget_steps_total") or 0.0
    before_off = value("vllm:anyorder_budget_steps_without_drafts_total") or 0.0
    with_drafts = NS(spec_decoding_stats=NS(num_draft_tokens=8, num_accepted_tokens=5))
    for stats in (with_drafts, NS(spec_decoding_stats=None), with_drafts):
        logger.record(stats, None)
    assert value("vllm:anyorder_budget_steps_total") - before == 3
    assert value("vllm:anyorder_budget_steps_without_drafts_total") - before_off == 1
    # rank 0's snapshot becomes gauges at log()
    path = metrics.budget_snapshot_path("unit-test")
    with open(path, "w") as f:
        json.dump({"cost_slope_s_per_row": 0.002, "last_rows": 7, "predicted_gain": 1.4}, f)
    logger.log()
    assert value("vllm:anyorder_budget_draft_rows") == 7
    assert value("vllm:anyorder_budget_cost_slope_seconds_per_row") == pytest.approx(0.002)


def test_engines_without_a_plugin_method_get_nothing():
    logger = metrics.BudgetStatLogger(config(method="ngram", model=None))
    assert not logger.enabled
    logger.record(NS(spec_decoding_stats=None), None)
    logger.log()


def test_the_snapshot_is_rewritten_in_place_and_read_as_json(tmp_path):
    """Rank 0 rewrites one file in place (a rename over it took 204 ms in an engine step on a
    VM's ext4, issue 22); every version reads back as the state it wrote."""
    import os

    from vllm_anyorder.proposers.budget import StepBudget

    path = tmp_path / "snap.json"
    path.write_text('{"stale": "a longer file left by an engine before this one started"}' * 8)
    budget = StepBudget("auto", 8, snapshot_path=str(path))
    budget._write_snapshot()
    inode = os.stat(path).st_ino
    first = json.loads(path.read_text())
    assert first["last_rows"] == 0 and "stale" not in first
    budget.controller.last.rows = 12
    budget._write_snapshot()
    assert json.loads(path.read_text())["last_rows"] == 12
    assert os.stat(path).st_ino == inode  # the same file: no new one renamed over it
    fd = budget._snapshot_fd
    del budget
    import gc
    gc.collect()
    with pytest.raises(OSError):  # the snapshot's descriptor closed with its budget
        os.fstat(fd)
