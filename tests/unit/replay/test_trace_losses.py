"""``benchmarks/trace_losses``: what drafting steps lost against the same engine's plain steps,
per budget mode, and the steps in which the batch changed (issue 22)."""

from benchmarks.trace_losses import (batch_changes, bucket_label, calibration,
                                     first_draft_by_history, losses, plain_medians)


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
