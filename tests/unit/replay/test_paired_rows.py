"""benchmarks/paired._row: each round's ratio against the reference's pass of the same
round (the engines share that round's fast or slow minutes), outputs checked against the
reference, and rows that ``bench_floor.floor_table`` reads."""

from benchmarks.bench_floor import floor_table
from benchmarks.compare import Config
from benchmarks.paired import _row


def a_pass(seconds, outputs, forward_s, period_s, steps=100):
    return {"seconds": seconds, "outputs": outputs, "drafts": 0, "accepted": 0,
            "tokens_per_forward": 1.0, "loadavg_before": 0.5, "foreign_cpu": 0.01,
            "probe": {"calls": steps, "steps": steps, "period_s": period_s,
                      "forward_s": forward_s, "sample_s": 0.01}}


def test_rounds_are_paired_and_the_floor_table_reads_the_rows():
    base, off = Config("no-spec"), Config("off", reference="no-spec")
    out = [[1, 2, 3], [4, 5]]
    # round 0 is slow for both, round 1 fast: off is 0.9x inside each round
    runs = {"no-spec": [a_pass(2.0, out, 1.5, 2.0), a_pass(1.0, out, 0.75, 1.0)],
            "off": [a_pass(2.0 / 0.9, out, 1.5, 2.0 / 0.9), a_pass(1.0 / 0.9, out, 0.75, 1 / 0.9)]}
    rows = [_row(cfg, runs, [base, off], 8, "bfloat16") for cfg in (base, off)]
    assert abs(rows[1]["speedup_vs_nospec"] - 0.9) < 1e-9
    assert rows[1]["speedup_rounds"] == [rows[1]["speedup_rounds"][0]] * 2
    assert rows[1]["exact_match"] == 1.0 and rows[1]["reference"] == "no-spec [batch 8]"
    table = floor_table(rows)
    # the same forward, the rest of the step longer: all of the loss is the engine's part
    assert abs(table[1]["floor_engine"] - table[1]["floor_step"]) < 1e-9
    assert table[1]["floor_engine"] > 0.1


def test_a_differing_output_is_reported():
    base, off = Config("no-spec"), Config("off", reference="no-spec")
    runs = {"no-spec": [a_pass(1.0, [[1, 2], [3]], 0.5, 1.0)],
            "off": [a_pass(1.0, [[1, 2], [4]], 0.5, 1.0)]}
    assert _row(off, runs, [base, off], 1, "bfloat16")["exact_match"] == 0.5


def test_unreadable_counters_are_reported_as_none():
    # in one process only the last-built engine's spec-decode counters are registered
    base, off = Config("no-spec"), Config("off", reference="no-spec")
    runs = {"no-spec": [a_pass(1.0, [[1]], 0.5, 1.0)], "off": [a_pass(1.0, [[1]], 0.5, 1.0)]}
    row = _row(off, runs, [base, off], 1, "bfloat16", counters=False)
    assert row["drafts"] is None and row["tokens_per_target_forward"] is None
    assert _row(off, runs, [base, off], 1, "bfloat16")["drafts"] == 0


def test_a_greedy_divergence_is_located_and_its_reference_gap_asked():
    """paired.divergences: the first differing token of each differing (round, prompt), and
    the reference engine's top-2 log-probabilities there, asked again alone with the prompt
    and the output the two share before it (from the prompt alone, a lone run can leave the
    batch's output earlier and report another context's gap)."""
    from types import SimpleNamespace as NS

    from benchmarks.paired import divergences

    asked = []

    class Ref:
        def get_tokenizer(self):
            return lambda text: NS(input_ids=[100 + int(text[1:])])

        def generate(self, prompts, params, use_tqdm=False):
            asked.append((prompts, params.max_tokens, params.logprobs))
            lp = {7: NS(logprob=-0.693), 9: NS(logprob=-0.701), 3: NS(logprob=-5.0)}
            return [NS(outputs=[NS(logprobs=[lp])])]

    ref = [[1, 7, 5], [2, 2]]
    runs = [{"outputs": [[1, 7, 5], [2, 2]]}, {"outputs": [[1, 9, 5], [2, 2]]}]
    found = divergences(Ref(), ["p0", "p1"], NS(ignore_eos=True), ref, runs)
    assert len(found) == 1 and found[0]["round"] == 1 and found[0]["prompt"] == 0
    assert found[0]["token"] == 1 and found[0]["reference"] == [7] and found[0]["row"] == [9]
    assert found[0]["top2"] == [[7, -0.693], [9, -0.701]] and abs(found[0]["gap"] - 0.008) < 1e-9
    assert found[0]["agrees"] == "reference"
    assert [(p[0]["prompt_token_ids"], n, k) for p, n, k in asked] == [([100, 1], 1, 2)]


def test_the_floor_in_forwards_holds_when_the_machine_slows_between_passes():
    """A round's two passes run one after the other: where the machine ran the drafts-off
    pass at half speed, its milliseconds double, but its step counted in its own forwards
    still shows the true +10%."""
    base, off = Config("no-spec"), Config("off", reference="no-spec")
    out = [[1, 2, 3]]
    runs = {"no-spec": [a_pass(1.0, out, 1.0, 2.0)],
            "off": [a_pass(2.2, out, 2.0, 4.4)]}  # every part twice as slow, and 10% more
    rows = [_row(cfg, runs, [base, off], 1, "bfloat16") for cfg in (base, off)]
    table = floor_table(rows)
    assert abs(table[1]["floor_step"] - 1.2) < 1e-9
    assert abs(table[1]["floor_forwards"] - 0.1) < 1e-9
    assert "floor_forwards" not in table[0]


def test_a_row_without_forward_timings_has_no_floor_in_forwards():
    base, off = Config("no-spec"), Config("off", reference="no-spec")
    runs = {"no-spec": [a_pass(1.0, [[1]], 0.0, 1.0)], "off": [a_pass(1.1, [[1]], 0.0, 1.1)]}
    rows = [_row(cfg, runs, [base, off], 1, "bfloat16") for cfg in (base, off)]
    assert floor_table(rows)[1]["floor_forwards"] is None
