"""dLLM row scores (core/dllm_scores.py): decisions read through cached, batched scores are
bit-identical to the rule on raw logits (``dllm_blocks.decide``), and each row is scored once."""

from dataclasses import replace

import pytest
import torch

from vllm_anyorder.core import dllm_blocks, dllm_scores
from vllm_anyorder.core.dllm_blocks import DllmSettings, Plan, Step, apply, decide, schedule
from vllm_anyorder.core.dllm_scores import NodeLogits, decide_at, prefetch, score, simulate

V, MASK = 512, 7
S = DllmSettings(mask_id=MASK, max_tokens=24, block_length=8, steps_per_block=4)
RULES = {"greedy": S, "greedy-random": replace(S, remasking="random"),
         "t0.8": replace(S, temperature=0.8)}


def canvas_with_masks(gen: torch.Generator) -> torch.Tensor:
    c = torch.randint(10, V, (S.max_tokens,), generator=gen)
    c[torch.rand(S.max_tokens, generator=gen) < 0.6] = MASK
    return c


def logits(gen: torch.Generator, rows: int, dtype=torch.bfloat16) -> torch.Tensor:
    lg = torch.randn(rows, V, generator=gen) * 3
    lg[:, 11] = lg[:, 12]  # exact ties inside a row: the first index must win
    return lg.to(dtype)


def count_scored_rows(monkeypatch) -> list[int]:
    """Rows per call of the rule's vocabulary math, from now on."""
    calls, real = [], dllm_blocks.row_scores
    monkeypatch.setattr(dllm_scores, "row_scores",
                        lambda lg, m: calls.append(len(lg)) or real(lg, m))
    return calls


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_decide_at_equals_the_rule_on_raw_logits(rule, dtype):
    s, gen = RULES[rule], torch.Generator().manual_seed(3)
    for trial in range(30):
        canvas, w0 = canvas_with_masks(gen), 8 * (trial % 2)
        node = NodeLogits(logits(gen, S.max_tokens - w0, dtype), w0)
        for block in range(w0 // 8, 3):
            pos = dllm_blocks.masked_in_block(canvas, s, block)
            if not pos.numel():
                continue
            step = Step(index=block * 4 + trial % 4, block=block, count=1 + trial % 3)
            want = decide(node.logits[pos - w0], pos, step, s, seed=trial)
            assert decide_at(canvas, step, node, s, seed=trial) == want
            assert decide_at(canvas, step, node, s, seed=trial) == want  # from the cache


def test_batched_scores_equal_scores_of_one_row_at_a_time():
    gen = torch.Generator().manual_seed(0)
    nodes = [NodeLogits(logits(gen, 16), 0) for _ in range(5)]
    rows = [torch.randperm(16, generator=gen)[: 3 + i] for i in range(5)]
    score(list(zip(nodes, rows)), MASK)
    for node, r in zip(nodes, rows):
        for row in r.tolist():
            x0, conf = dllm_blocks.row_scores(node.logits[row: row + 1], MASK)
            assert int(node.x0[row]) == int(x0[0]) and float(node.conf[row]) == float(conf[0])
        others = torch.ones(16, dtype=torch.bool)
        others[r] = False
        assert bool((node.x0[others] == -1).all())  # only what was asked for


def test_simulate_and_the_decision_before_it_score_each_row_once(monkeypatch):
    calls = count_scored_rows(monkeypatch)
    s = replace(S, max_tokens=8, steps_per_block=8)
    canvas = torch.full((8,), MASK)
    node = NodeLogits(logits(torch.Generator().manual_seed(1), 8), 0)
    steps = schedule(s)
    d0 = decide_at(canvas, steps[0], node, s, 0)  # the node's own decision: 8 rows scored
    drafts = simulate(apply(canvas, d0), steps[1:5], node, s, 0)  # SSD / FreeDave drafts
    assert len(drafts) == 4 and calls == [8]


def test_prefetch_scores_node_zero_of_every_greedy_request_in_one_batch(monkeypatch):
    calls = count_scored_rows(monkeypatch)

    class Req:  # what prefetch reads of a request
        def __init__(self, s):
            self.s, self.steps = s, schedule(s)

    gen = torch.Generator().manual_seed(2)
    rounds = []
    for s in (S, S, RULES["t0.8"]):
        canvas = canvas_with_masks(gen)
        plan = Plan(canvas[None], (0, 8), 0)
        rounds.append((Req(s), plan, [NodeLogits(logits(gen, 8), 0)]))
    prefetch(rounds)
    masked = [int((r[1].nodes[0, :8] == MASK).sum()) for r in rounds[:2]]
    assert calls == [sum(masked)]  # one batch; the sampling request draws per step instead
    assert rounds[2][2][0].x0 is None
