"""benchmarks/serve_probe.difference: a client run's per-step split and per-process CPU."""

from benchmarks.serve_probe import difference


def snap(calls, steps, period, forward, sample, cpu):
    return {"steps": {"calls": calls, "steps": steps, "period_s": period, "execute_s": 0.0,
                      "forward_s": forward, "sample_s": sample}, "cpu": cpu}


def test_per_step_split_counts_only_the_run_between_the_snapshots():
    before = snap(100, 99, 1.0, 0.7, 0.1, {"1:VLLM::Worker": 5.0, "2:VLLM::EngineCore": 4.0})
    after = snap(1100, 1099, 11.0, 8.7, 0.6,
                 {"1:VLLM::Worker": 15.0, "2:VLLM::EngineCore": 9.0, "3:late": 0.5})
    d = difference(before, after, tokens=2000)
    assert d["steps"] == 1000
    assert d["period_ms"] == 10.0 and d["forward_ms"] == 8.0
    assert d["engine_ms"] == 2.0 and d["sample_ms"] == 0.5
    # CPU ms per generated token, by process title; a process born during the run counts whole
    assert d["cpu_ms_per_token"] == {"VLLM::Worker": 5.0, "VLLM::EngineCore": 2.5, "late": 0.25}


def test_rows_per_step_and_steps_with_drafts_come_through_unsuffixed():
    before = snap(100, 99, 1.0, 0.7, 0.1, {})
    after = snap(1100, 1099, 11.0, 8.7, 0.6, {})
    before["steps"].update(rows=900, draft_steps=10)
    after["steps"].update(rows=9900, draft_steps=60)
    d = difference(before, after, tokens=2000)
    assert d["rows"] == 9.0 and d["draft_steps"] == 0.05


def test_in_forwards_compares_periods_in_each_servers_own_forwards():
    from benchmarks.bench_serve import in_forwards

    def run(period, forward, rows=9.0):
        return {"probe": {"period_ms": period, "forward_ms": forward, "rows": rows}}

    # the plugin's servers ran their forwards 20% slower (another instance), 2% more per step
    ref = [run(13.0, 10.0), run(10.4, 8.0), run(11.7, 9.0)]
    mine = [run(1.2 * 13.0 * 1.02, 12.0), run(1.2 * 10.4 * 1.02, 9.6)]
    assert "+2.0%" in in_forwards(mine, ref) and "9.00 vs 9.00" in in_forwards(mine, ref)
    assert in_forwards(mine, [{"probe": None}]) == ""  # no probe: nothing to say
