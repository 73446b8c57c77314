"""``benchmarks/replay_lone``: a fixed size's recorded acceptance, extracted from a budget
trace and replayed through ``auto`` at batch 1 by token position."""

import json

from benchmarks.replay_lone import accepted_at, extract, replay


def write_trace(path, requests=3, steps=12):
    """A ``bench_switch --interleave`` trace: ``cycle:4`` steps accepting 3 of 4 drafts,
    then ``auto``'s plain steps (which price plain decoding)."""
    lines = []
    for r in range(requests):
        for _ in range(steps):
            lines.append({"mode": "cycle", "clean": True, "seconds": 0.012,
                          "requests": [[f"q{r}", 4, 3]]})
    for _ in range(10):
        lines.append({"clean": True, "seconds": 0.005, "requests": [["a", 0, 0]]})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_extract_keeps_each_requests_record_and_the_step_prices(tmp_path):
    trace = tmp_path / "trace-1.jsonl"
    write_trace(trace)
    data = extract([str(trace)], 4)
    assert data["streams"] == [[3] * 12] * 3
    assert data["seconds"] == {4: 0.012, 0: 0.005}


def test_acceptance_is_read_by_token_position():
    stream = [0, 4, 1]  # steps begin at tokens 0, 1, 6
    assert [accepted_at(stream, n) for n in (0, 1, 5, 6, 50)] == [0, 4, 4, 1, 1]


def test_auto_finds_drafting_that_pays_and_plain_decoding_is_slower(tmp_path):
    trace = tmp_path / "trace-1.jsonl"
    write_trace(trace)
    data = extract([str(trace)], 4)
    common = dict(passes=2, tokens=64, most=8, beyond=0.0, batch2=5)
    fixed = replay(data, "cycle:4", 0, **common)
    plain = replay(data, "cycle:0", 0, **common)
    auto = replay(data, "auto", 0, **common)
    assert plain[0] / fixed[0] > 1.5  # 4 tokens in 12 ms against 1 in 5
    assert 0.85 < fixed[1] / auto[1] < 1.03  # warm, auto drafts too; none beats 4 in 12 ms
