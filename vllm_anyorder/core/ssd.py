"""SSD: Self Speculative Decoding for diffusion LLMs (Gao et al., Sec. 3.2, Algorithm 1).

Each forward verifies a *chain*: node 0 is the current canvas, node k+1 is node k with the
k-th drafted step applied (Sec. 3.2.3, "greedy strategy ... exactly N+1 nodes"). The drafted
steps are the baseline's rule run on the logits of the last visited node of the previous
forward (``dllm_blocks.simulate``): at temperature 0 with low-confidence remasking that is
exactly the paper's selection -- the most confident drafted positions of the current block
first, spilling into the next block only once the current one is used up (Sec. 3.2.2,
block-ordered greedy). At T > 0 each drafted step uses that step's own noise.

Verification (Sec. 3.2.4): walking from node 0, the baseline's decision at node k (from node
k's own logits) must equal drafted step k+1 to move on. The walk stops at the first mismatch
(or the leaf) and commits that node's decision too -- the leaf's token: up to N+1 steps per
forward, never fewer than 1. Algorithm 1's separate first self-draft forward is folded in: the
first chain has no drafts, so its forward is an ordinary baseline step that also yields drafts.

Mix-order (Sec. 5.2, ``mix_order``): for each non-leaf node k with a grandchild, one more node
m_k = node k + drafted step k+2 (skipping k+1). If node k's decision is step k+2 instead of
k+1 (out-of-order generation) the walk goes to m_k, and if m_k's decision is step k+1 it is
back on the chain at node k+2. N-1 extra nodes (5 -> 8 for N = 4, as in Table 3).

Budget (``plan(req, limit)``): a round drafts min(N, limit) steps; limit 0 is a chain of one
node, the baseline's forward, whose logits still become the next drafts (state kept warm).
"""

from __future__ import annotations

import torch

from .dllm_blocks import DllmSettings, Plan, apply
from .dllm_scores import decide_at, simulate


class Ssd:
    def __init__(self, s: DllmSettings) -> None:
        self.s = s
        self.draft = None  # NodeLogits of the last visited node of the last forward
        self._pending = None

    def plan(self, req, limit=None):
        s, i = self.s, req.i
        n = s.draft_length if limit is None else max(0, min(s.draft_length, limit))
        groups = []
        if self.draft is not None and n > 0:
            groups = simulate(req.canvas, req.steps[i: i + n], self.draft, s, req.seed)
        chain = [req.canvas]
        for g in groups:
            chain.append(apply(chain[-1], g))
        # node key -> (canvas, step index); m_k = chain[k] + groups[k+1] sits at step i+k+1
        nodes = {("c", k): (c, i + k) for k, c in enumerate(chain)}
        if s.mix_order:
            nodes.update({("m", k): (apply(chain[k], groups[k + 1]), i + k + 1)
                          for k in range(len(groups) - 1)})
        live = [key for key, (_, st) in nodes.items() if st < len(req.steps)]  # not terminal
        self._pending = (groups, nodes, {key: row for row, key in enumerate(live)})
        last = max(nodes[key][1] for key in live)
        drafted = sum(kind == "c" for kind, _ in live) - 1  # chain nodes past node 0
        return Plan(torch.stack([nodes[key][0] for key in live]),
                    req.window(i, last, n), i, drafted)  # next drafts: n steps

    def room(self, req) -> int:
        """Drafted steps the next plan can use (a terminal leaf is one of them: it is never
        forwarded); none before the first forward gave draft logits."""
        return 0 if self.draft is None else min(self.s.draft_length, len(req.steps) - req.i)

    def advance(self, req, plan, logits) -> None:
        """logits: one ``NodeLogits`` per node of ``plan``."""
        groups, nodes, rows = self._pending
        n = len(groups)
        key = ("c", 0)
        while True:
            canvas, st = nodes[key]
            if st == len(req.steps):  # the leaf finished the schedule: nothing to decide
                req.move(canvas, st - req.i)
                self.draft = None
                return
            d = decide_at(canvas, req.steps[st], logits[rows[key]], self.s, req.seed)
            kind, k = key
            if kind == "c" and k < n and d == groups[k]:
                key = ("c", k + 1)
            elif kind == "c" and self.s.mix_order and k + 1 < n and d == groups[k + 1]:
                key = ("m", k)  # out of order: drafted step k+2 came first
            elif kind == "m" and d == groups[k]:
                key = ("c", k + 2)  # ... and step k+1 right after: back on the chain
            else:  # mismatch or leaf: this node's own decision is the last committed step
                req.move(apply(canvas, d), st + 1 - req.i)
                self.draft = logits[rows[key]]
                return
