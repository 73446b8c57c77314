"""``benchmarks/trace_losses``: what drafting steps lost against the same engine's plain steps,
per budget mode, and the steps in which the batch changed (issue 22)."""

from benchmarks.trace_losses import (after_drafting, batch_changes, bucket_label,
                                     calibration, first_draft_by_history, losses, passes,
                                     plain_medians, usual_batch)


def step(t, seconds, drafting=False, accepted=(0, 0), clean=True, mode=None):
    line = {"t": t, "seconds": seconds if clean else 0.0, "drafting": drafting,
            "clean": clean, "requests": [[f"r{i}", 2 if drafting else 0, a]
                                         for i, a in enumerate(accepted)]}
    return {**line, **({"mode": mode} if mode else {})}


def test_drafting_is_charged_at_the_plain_price_of_every_mode_and_split_by_mode():
    lines = [
        step(0.00, 0.010),                               # auto, plain: 2 tokens in 10 ms
        step(0.01, 0.020, True, (1, 0)),                 # auto, drafting: 3 tokens in 20 ms
        step(0.03, 0.010, mode="cycle"),                 # drafts off, plain
        step(0.04, 0.012, True, (2, 2), mode="cycle"),   # a fixed size: 6 tokens in 12 ms
    ]
    assert plain_medians(lines) == {2: 0.010}
    auto, auto_s = losses(lines, "auto")
    # 20 ms against 3 tokens at 5 ms each: 5 ms lost
    assert abs(auto[2]["lost_s"] - 0.005) < 1e-12 and auto[2]["drafting_steps"] == 1
    assert abs(auto_s - 0.030) < 1e-12
    fixed, _ = losses(lines, "cycle")
    assert abs(fixed[2]["lost_s"] - (0.012 - 0.030)) < 1e-12  # a gain
    both, total = losses(lines)
    assert abs(both[2]["lost_s"] - (0.005 - 0.018)) < 1e-12 and abs(total - 0.052) < 1e-12


def test_batch_changes_are_timed_from_the_step_before_and_idle_gaps_left_out():
    lines = [step(0.000, 0.01), step(0.015, 0.01, clean=False),  # a join: 15 ms
             step(0.025, 0.01), step(3.000, 0.01, clean=False),   # after idle: not counted
             step(3.010, 0.01, mode="cycle"), step(3.030, 0.01, clean=False, mode="cycle")]
    n, seconds, excess = batch_changes(lines, "auto")
    # plain price 5 ms a token (10 ms for 2): the join's 15 ms committed 2 tokens, 5 ms over
    assert n == 1 and abs(seconds - 0.015) < 1e-12 and abs(excess - 0.005) < 1e-12
    n, seconds, excess = batch_changes(lines, "cycle")
    assert n == 1 and abs(seconds - 0.020) < 1e-12 and abs(excess - 0.010) < 1e-12


def test_batch_change_excess_prices_tokens_at_the_nearest_batch_size():
    lines = [step(0.000, 0.010, accepted=(0, 0, 0, 0)),  # batch 4: 2.5 ms a token
             step(0.020, 0.0, accepted=(0,), clean=False),  # batch 1: priced at batch 4's
             step(0.050, 0.0, accepted=(0, 0, 0, 0, 0, 0), clean=False)]  # 6 tokens, 30 ms
    n, seconds, excess = batch_changes(lines, "auto")
    assert n == 2 and abs(seconds - 0.050) < 1e-12
    assert abs(excess - ((0.020 - 0.0025) + (0.030 - 6 * 0.0025))) < 1e-12


def test_first_draft_is_split_by_what_the_request_did_the_step_before():
    lines = [step(0.0, 0.01, accepted=(0, 0)),               # plain
             step(0.1, 0.02, True, (0, 2)),                  # r0 after plain; r1 after plain
             step(0.2, 0.02, True, (1, 0)),                  # r0 after a rejection; r1 whole
             step(0.3, 0.02, True, (0, 0), mode="cycle"),    # another mode: not counted
             step(0.4, 0.02, True, (2, 2))]                  # both after another mode: plain
    lines[1]["gains"] = {"r0": [0.4, 0.1], "r1": [0.8, 0.6]}
    lines[2]["gains"] = {"r0": [0.2, 0.1], "r1": [0.9, 0.8]}
    lines[3]["gains"] = {"r0": [0.9, 0.9], "r1": [0.9, 0.9]}
    lines[4]["gains"] = {"r0": [0.6, 0.5], "r1": [0.2, 0.1]}
    out = first_draft_by_history(lines)
    assert out["after plain"][0] == 4 and abs(out["after plain"][1] - 0.5) < 1e-12
    assert out["after plain"][2] == 0.75  # accepted: r1 at t=0.1 and both at 0.4, not r0 at 0.1
    assert out["after a rejection"] == (1, 0.2, 1.0)
    assert out["after a whole chain"] == (1, 0.9, 0.0)


def test_calibration_compares_the_priced_gains_with_the_accepted_rows_by_position():
    a = step(0.0, 0.02, True, (2, 0))
    a["gains"] = {"r0": [0.9, 0.5], "r1": [0.5, 0.1]}  # r0: both accepted, r1: none
    b = step(0.1, 0.02, True, (1, 0), mode="cycle")
    b["gains"] = {"r0": [0.9, 0.9], "r1": [0.9, 0.9]}  # another mode: not counted
    assert calibration([a, b]) == {0: (2, 0.7, 0.5), 1: (2, 0.3, 0.5)}
    assert calibration([step(0.0, 0.01)]) == {}  # lines without gains
    assert [bucket_label(b) for b in (0, 7, 8, 9, 10)] == ["1", "8", "9-11", "12-15", "16-22"]


def test_plain_steps_are_grouped_by_steps_since_the_modes_last_drafting_step():
    lines = [step(0.00, 0.010),                          # before any drafting: not counted
             step(0.01, 0.020, True, (1, 1)),            # drafting
             step(0.03, 0.014), step(0.05, 0.0, clean=False),  # 1st; a batch change: skipped
             step(0.06, 0.012), step(0.07, 0.011),       # 2nd, 3rd
             step(0.08, 0.010, mode="cycle"),            # another mode: the count stops
             step(0.09, 0.013)]                          # not counted (no drafting since)
    lines += [step(0.10 + 0.01 * i, 0.010) for i in range(3)]
    out = after_drafting(lines, 2)
    assert list(out) == ["1", "2-5"] and out["1"] == (1, 0.014)
    assert out["2-5"] == (2, 0.0115)
    lines[-3:] = [step(0.20, 0.02, True, (0, 0))] + [step(0.21 + 0.01 * i, 0.010)
                                                     for i in range(31)]
    out = after_drafting(lines, 2)
    assert out["6-30"][0] == 25 and out[">30"] == (1, 0.010) and out["1"][0] == 2
    assert usual_batch(lines) == 2


def test_passes_split_at_mode_changes_and_idle_gaps():
    run = [step(0.01 * i, 0.010) for i in range(5)]
    run[1] = {**run[1], "guarded": True}
    run[2] = step(0.02, 0.02, True, (1, 0))
    other = [step(1.0 + 0.01 * i, 0.012, mode="cycle") for i in range(4)]
    later = [step(5.0 + 0.01 * i, 0.009) for i in range(4)]  # after an idle gap: its own
    out = passes(run + other + later, 2, least=4)
    assert [(r["mode"], r["steps"], r["drafting"], r["guarded"]) for r in out] == [
        ("auto", 5, 1, 1), ("cycle", 4, 0, 0), ("auto", 4, 0, 0)]
    assert [r["plain_s"] for r in out] == [0.010, 0.012, 0.009]
    assert passes(run, 2, least=6) == []
