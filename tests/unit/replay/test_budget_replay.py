"""benchmarks/budget_replay.py on synthetic traces: with drafts always accepted and a flat cost
the largest fixed size wins (and ``auto`` follows it); with drafts never accepted and a cost
that grows with rows every fixed size loses and ``auto`` stops drafting; the committed jacobi
trace replays on its own measured profile close to what the recording measured."""

import json

import pytest

from benchmarks import budget_replay as br
from benchmarks.cost_profiles import Measured, Profile

K, BATCH, STEPS = 8, 4, 60


def write_trace(path, accepted, steps=STEPS, batch=BATCH, k=K, seconds=0.01, method="jacobi"):
    """A recording directory: every request drafts k per step, ``accepted(step, row)`` kept."""
    path.mkdir()
    lines = []
    for t in range(steps):
        reqs = [[f"r{i}", k, accepted(t, i)] for i in range(batch)]
        lines.append({"rows": batch * (1 + k), "drafting": True, "clean": t > 0,
                      "seconds": seconds if t > 0 else 0.0, "requests": reqs})
    (path / "trace-1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (path / "meta.json").write_text(json.dumps({"method": method, "prompt_tokens": [32]}))
    return br.load_traces(path)[0]


def profile(points):
    return Profile("synthetic", "measured", "synthetic", {"m": Measured(points, points)})


FLAT = profile([(1.0, 0.01), (4096.0, 0.01)])
STEEP = profile([(1.0, 0.001), (4096.0, 4.096)])  # 1 ms per row


def by_policy(res):
    return {r["policy"]: r for r in res["policies"]}


def test_always_accepted_on_flat_cost_largest_fixed_wins(tmp_path):
    trace = write_trace(tmp_path / "t", lambda t, i: K)
    res = br.replay_all(trace, FLAT, min_steps=400)
    rows = by_policy(res)
    assert res["best_fixed"]["policy"] == f"fixed k={K}"
    # flat cost: the speed-up is the tokens per request-step, (K + 1) / 1
    assert rows[f"fixed k={K}"]["speedup_vs_no_spec"] == pytest.approx(K + 1, rel=1e-6)
    speedups = [rows[f"fixed k={k}"]["speedup_vs_no_spec"] for k in br.sweep(K)]
    assert speedups == sorted(speedups)
    assert res["auto"]["speedup_vs_no_spec"] >= 0.9 * (K + 1)
    assert res["auto"]["mean_draft_rows_per_request"] > 0.9 * K


def test_never_accepted_on_steep_cost_auto_ties_no_speculation(tmp_path):
    trace = write_trace(tmp_path / "t", lambda t, i: 0)
    res = br.replay_all(trace, STEEP, min_steps=400)
    rows = by_policy(res)
    fixed = [rows[f"fixed k={k}"]["speedup_vs_no_spec"] for k in br.sweep(K)]
    assert all(s < 1.0 for s in fixed) and fixed == sorted(fixed, reverse=True)
    assert rows["no speculation"]["tokens"] == rows[f"fixed k={K}"]["tokens"]
    # issue 22's goal for drafts almost never accepted is >= 0.9x; within 400 steps the
    # controller's warm-up probes (one draft per request, every other step) cost a few %
    assert 0.92 <= res["auto"]["speedup_vs_no_spec"] <= 1.0 + 1e-9
    assert res["auto"]["share_steps_without_drafts"] > 0.9


def test_mixed_acceptance_auto_beats_uniform_fixed(tmp_path):
    """Half the requests always accepted, half never: ``auto`` drafts for the first half only,
    which no uniform fixed size can do, on a cost that grows with rows."""
    trace = write_trace(tmp_path / "t", lambda t, i: K if i % 2 == 0 else 0)
    cost = profile([(1.0, 0.004), (4096.0, 0.004 + 4095 * 2e-4)])
    res = br.replay_all(trace, cost, min_steps=600)
    assert res["auto"]["speedup_vs_no_spec"] > res["best_fixed"]["speedup_vs_no_spec"]


def test_assd_self_drafting_pays_a_second_forward_on_gpu_profiles(tmp_path):
    """Same acceptance: ``assd`` (self drafter, the default) costs its query-stream forward on
    a roofline profile, not on its own measured one (the recorded steps hold it)."""
    roofline = br.load_profile("h100-roofline")
    res = {m: br.replay_all(write_trace(tmp_path / m, lambda t, i: 2, method=m), roofline, 60)
           for m in ("jacobi", "assd")}
    assert res["assd"]["drafting_forward_added"] and not res["jacobi"]["drafting_forward_added"]
    fixed = f"fixed k={K}"
    assert by_policy(res["assd"])[fixed]["speedup_vs_no_spec"] < \
        by_policy(res["jacobi"])[fixed]["speedup_vs_no_spec"]
    trace = br.load_traces(tmp_path / "assd")[0]
    assert not br.replay_all(trace, br.measured_profile(trace), 60)["drafting_forward_added"]


def test_caps_never_exceed_recorded_drafts(tmp_path):
    trace = write_trace(tmp_path / "t", lambda t, i: (t + i) % (K + 1))
    trace.steps[5].limits = [0, 2, K, 1]
    res = br.replay(trace, FLAT.targets["m"], "auto", min_steps=0)
    assert res.draft_rows <= sum(sum(s.limits) for s in trace.steps)
    plain = br.replay(trace, FLAT.targets["m"], "no speculation")
    assert plain.tokens == sum(len(s.req_ids) for s in trace.steps)


def test_contexts_grow_with_committed_tokens(tmp_path):
    trace = write_trace(tmp_path / "t", lambda t, i: 3)
    assert trace.steps[0].context == 32
    assert trace.steps[2].context == 32 + 2 * 4


def test_committed_trace_replays_close_to_its_recording():
    trace = br.load_traces(br.REPO / "benchmarks/results/traces/jacobi-n16")[0]
    own = br.measured_profile(trace)
    _, cost = own.target_for(trace.kind)
    replayed = br.replay(trace, cost, max(max(s.limits) for s in trace.steps))
    # fixed at the maximum = the recorded policy (caps = the recorded drafts)
    recorded = br.recorded_rate(trace)
    assert replayed.tokens_per_s == pytest.approx(recorded, rel=0.2)
    assert "measured" in own.label.lower() and own.kind == "measured"


def test_main_writes_json_naming_profiles(tmp_path, capsys):
    write_trace(tmp_path / "t", lambda t, i: 2)
    out = tmp_path / "out.json"
    assert br.main([str(tmp_path / "t"), "--profile", "h100-roofline", "--min-steps", "60",
                    "--out", str(out), "--fit-out", str(tmp_path / "fits")]) == 0
    data = json.loads(out.read_text())
    names = [r["profile"] for r in data["results"]]
    assert names == ["measured:t", "h100-roofline"]
    assert "ROOFLINE" in data["results"][1]["profile_label"]
    assert (tmp_path / "fits" / "measured-t.json").exists()
    text = capsys.readouterr().out
    # every policy's line names its profile, and so do the header and the summary
    assert "min(A_t, c) + 1" in text
    assert text.count("h100-roofline") >= len(data["results"][1]["policies"]) + 2
