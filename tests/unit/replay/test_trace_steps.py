"""``benchmarks/trace_steps``: modes side by side per batch size, and one mode's row changes
(issue 22)."""

from benchmarks.trace_steps import by_batch, main, row_changes


def step(seconds, rows, batch=2, drafting=True, accepted=0, mode=None, probe=False,
         clean=True):
    line = {"t": 0.0, "seconds": seconds, "rows": rows, "drafting": drafting, "clean": clean,
            "requests": [[f"r{i}", rows // batch - 1, accepted] for i in range(batch)]}
    return {**line, **({"mode": mode} if mode else {}), **({"probe": True} if probe else {})}


def test_modes_are_summed_per_batch_size_from_clean_steps_only():
    lines = [step(0.004, 6, accepted=1), step(0.002, 2, drafting=False),
             step(0.003, 3, batch=1, accepted=2), step(0.009, 6, clean=False),
             step(0.005, 6, accepted=2, mode="cycle")]
    got = by_batch(lines)
    assert got[("auto", 2)] == (2, 0.006, 4 + 2)  # 2 x (1 + 1) tokens, then 2 plain
    assert got[("auto", 1)] == (1, 0.003, 3)
    assert got[("cycle", 2)] == (1, 0.005, 6)
    assert len(got) == 3  # the unclean step counts nowhere


def test_row_changes_split_drafting_pairs_of_one_batch_size_and_skip_probes():
    lines = [step(0.004, 6), step(0.004, 6),           # kept
             step(0.005, 8),                            # changed
             step(0.006, 10, probe=True),               # a probe: out, and so is the next
             step(0.005, 6),
             step(0.003, 3, batch=1),                   # another batch size: not a pair
             step(0.002, 1, batch=1, drafting=False),   # plain: not a pair
             step(0.004, 3, batch=1), step(0.004, 3, batch=1, mode="cycle")]
    got = row_changes(lines)
    assert got[False] == [(0.004, 6)]
    assert got[True] == [(0.005, 8)]


def test_the_command_prints_both_tables(tmp_path, capsys):
    import json
    (tmp_path / "trace-1.jsonl").write_text(
        "\n".join(json.dumps(x) for x in [step(0.004, 6), step(0.005, 8)]) + "\n")
    main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "batch   2:     2 steps" in out and "rows changed: 1 steps" in out
