"""The ``step_timing`` diagnostic patch: its timers sum what bench_floor divides."""

import time

import pytest

from vllm_anyorder.patches import step_timing


@pytest.fixture()
def totals(monkeypatch):
    fresh = {k: type(v)(0) for k, v in step_timing.TOTALS.items()}
    monkeypatch.setattr(step_timing, "TOTALS", fresh)
    monkeypatch.setattr(step_timing, "_LAST_START", [0.0])
    return fresh


def test_periods_sum_between_step_starts_and_skip_idle_gaps(totals):
    step = step_timing._timed(lambda: time.sleep(0.01), "execute_s", starts_step=True)
    forward = step_timing._timed(lambda: time.sleep(0.005), "forward_s")
    for _ in range(3):
        step()
        forward()
    time.sleep(step_timing.IDLE_GAP_S + 0.05)  # the engine idles: not a step period
    step()
    assert totals["calls"] == 4
    assert totals["steps"] == 2  # the first call has no predecessor; the idle gap is skipped
    assert 2 * 0.015 <= totals["period_s"] < 2 * step_timing.IDLE_GAP_S
    assert 4 * 0.01 <= totals["execute_s"] < 4 * 0.01 + 0.2
    assert 3 * 0.005 <= totals["forward_s"] < 3 * 0.05


def test_timer_counts_a_call_that_raises(totals):
    def boom():
        raise RuntimeError("x")

    timed = step_timing._timed(boom, "sample_s")
    with pytest.raises(RuntimeError):
        timed()
    assert totals["sample_s"] > 0 and totals["calls"] == 0


def test_ledger_entry_applies_only_on_request():
    from vllm_anyorder import patches

    entry = patches.BY_NAME["step_timing"]
    assert step_timing.ENV in entry.process
    assert entry.section("Why") and entry.section("Remove")


def test_rows_and_steps_with_drafts_are_counted_per_step(totals):
    class Out:
        def __init__(self, rows, drafts):
            self.total_num_scheduled_tokens = rows
            self.scheduled_spec_decode_tokens = drafts

    step = step_timing._timed(lambda runner, scheduler_output: None, "execute_s",
                             starts_step=True)
    step(None, Out(9, {}))
    step(None, Out(25, {"r1": [-1] * 16}))  # a request vLLM padded to [token, -1 x k]
    step(None, scheduler_output=Out(8, {}))
    assert totals["rows"] == 42 and totals["draft_steps"] == 1
    split = step_timing.per_step(totals)
    assert split["rows"] == 14.0 and abs(split["draft_steps"] - 1 / 3) < 1e-9
