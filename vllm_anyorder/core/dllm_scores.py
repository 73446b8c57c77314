"""A node's logits with its per-row scores computed once, in batches: the costly half of the
dLLM decision rule (``dllm_blocks.decide``), shared by every step that reads the same rows.

At temperature 0 a step reads two numbers per masked position of its block: x0 (the argmax,
mask token excluded) and, for low-confidence remasking, softmax(logits)[x0] in float64
(``dllm_blocks.row_scores``). Neither depends on the step. So the drafted steps that SSD
(Sec. 3.2.2) and FreeDave (Alg. 2 lines 8-15) run on one node's logits, and the decision at
that node before them, score each row once; and the rows node 0 of every request in a round
is certain to read are scored in ONE batch (``prefetch``) instead of one small call per
request. Each score is computed by the same per-row operations as ``decide``, so decisions are
bit-identical to it (unit-tested); temperature > 0 draws noise per step and uses ``decide``.
"""

from __future__ import annotations

import torch

from .dllm_blocks import (
    REMASK_STREAM, Decision, DllmSettings, Step, apply, block_span, decide, masked_in_block,
    row_scores, select, uniform,
)


class NodeLogits:
    """Logits [w, V] of one node over generated positions [w0, w0 + w), and the scores of the
    rows scored so far (x0 = -1: not yet)."""

    def __init__(self, logits: torch.Tensor, w0: int) -> None:
        self.logits, self.w0 = logits, w0
        self.x0: torch.Tensor | None = None  # [w] long, allocated when a row is scored
        self.conf: torch.Tensor | None = None  # [w] float64

    def unscored(self, rows: torch.Tensor) -> torch.Tensor:
        if self.x0 is None:
            self.x0 = torch.full((self.logits.shape[0],), -1, dtype=torch.long)
            self.conf = torch.zeros(self.logits.shape[0], dtype=torch.float64)
            return rows
        return rows[self.x0[rows] < 0]

    @property
    def end(self) -> int:
        return self.w0 + self.logits.shape[0]

    def covers(self, s: DllmSettings, block: int) -> bool:
        lo, hi = block_span(s, block)
        return self.w0 <= lo and hi <= self.end


def score(work: list[tuple[NodeLogits, torch.Tensor]], mask_id: int) -> None:
    """Score the rows [r] of each (node, rows) not scored yet, all in one batch."""
    todo = [(node, node.unscored(rows)) for node, rows in work]
    todo = [(node, rows) for node, rows in todo if rows.numel()]
    if not todo:
        return
    device = todo[0][0].logits.device
    picked = [node.logits[rows.to(device)] for node, rows in todo]
    batch = picked[0] if len(picked) == 1 else torch.cat(picked)
    x0, conf = (t.cpu() for t in row_scores(batch, mask_id))  # [R], [R]
    start = 0
    for node, rows in todo:
        end = start + rows.numel()
        node.x0[rows], node.conf[rows] = x0[start:end], conf[start:end]
        start = end


def decide_at(canvas, step: Step, node: NodeLogits, s: DllmSettings, seed: int) -> Decision:
    """``decide`` at ``canvas`` from ``node``'s logits (which cover the step's block)."""
    pos = masked_in_block(canvas, s, step.block)
    rows = pos - node.w0
    if s.temperature > 0:
        return decide(node.logits[rows.to(node.logits.device)], pos, step, s, seed)
    score([(node, rows)], s.mask_id)
    conf = node.conf[rows] if s.remasking == "low_confidence" else \
        uniform(seed, REMASK_STREAM, step.index, pos)
    return select(pos, node.x0[rows], conf, step.count)


def simulate(canvas, steps, node: NodeLogits, s: DllmSettings, seed: int) -> list[Decision]:
    """Run the baseline's rule for ``steps`` on one node's fixed logits: the drafts of SSD
    (stale logits) and FreeDave (current logits). Stops at the first step whose block the
    logits do not cover."""
    out = []
    for st in steps:
        if not node.covers(s, st.block):
            break
        out.append(decide_at(canvas, st, node, s, seed))
        canvas = apply(canvas, out[-1])
    return out


def prefetch(rounds: list[tuple[object, object, list[NodeLogits]]]) -> None:
    """rounds: (request, its plan, its nodes' logits). Score in ONE batch the rows node 0 of
    each greedy request is certain to read: its masked positions in the block of the plan's
    ``first_step``. The other nodes are scored when (and if) a decision reads them."""
    by_mask: dict[int, list] = {}
    for req, plan, nodes in rounds:
        s = req.s
        if s.temperature > 0 or not 0 <= plan.first_step < len(req.steps):
            continue
        block = req.steps[plan.first_step].block
        if nodes[0].covers(s, block):
            rows = masked_in_block(plan.nodes[0], s, block) - nodes[0].w0
            by_mask.setdefault(s.mask_id, []).append((nodes[0], rows))
    for mask_id, work in by_mask.items():
        score(work, mask_id)
