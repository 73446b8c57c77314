"""FreeDave: Free Draft-and-Verification for diffusion LLMs (Wu & Zhang, Sec. 3.2, Algorithm 2).

The policy always holds the logits of its current canvas x (line 4: one forward before the
loop). From them the remasking scheduler is run ``d`` steps ahead (lines 8-15): draft X^k =
x with the baseline's next k steps decided on those same logits (``dllm_blocks.simulate``;
at temperature 0 with low-confidence remasking that is "the top-(n_i + ... + n_{i+k-1})
positions by confidence", within the block order). X^1 is the baseline's own next canvas, so
it needs no check.

One batched forward evaluates X^1..X^d (line 21); target k is the baseline's decision at X^k
(lines 23-30). X^{k+1} is verified iff it equals X^k plus target k (lines 32-39); with m
verified the policy jumps to X^{m+1} and keeps its logits (line 42): m+1 steps per forward.

Beyond the listing: a draft that completes the schedule is not forwarded (nothing is left
to decide there), and when X^1 already ends the output (schedule done or EOS determined) the
request finishes without a forward -- line 16's "no verification in the last step",
generalised to early EOS. With these the forward count never exceeds the baseline's.

Budget (``plan(req, limit)``): a round drafts min(d, limit + 1) canvases; limit 0 forwards
X^1 alone (the baseline's cost) and keeps its logits as the current ones (state kept warm).
"""

from __future__ import annotations

import torch

from .dllm_blocks import DllmSettings, Plan, apply, output_length
from .dllm_scores import decide_at, simulate


class FreeDave:
    def __init__(self, s: DllmSettings) -> None:
        self.s = s
        self.current = None  # NodeLogits of the current canvas
        self._drafts = None  # (decided steps, drafted canvases X^1..X^k) of the pending plan

    def plan(self, req, limit=None):
        s, i = self.s, req.i
        if self.current is None:  # line 4: the logits of the starting canvas
            self._drafts = None
            return Plan(req.canvas[None], req.window(i, i, s.draft_steps - 1), i)
        d = s.draft_steps if limit is None else max(1, min(s.draft_steps, limit + 1))
        groups = simulate(req.canvas, req.steps[i: i + d], self.current, s, req.seed)
        drafts = [apply(req.canvas, groups[0])]
        for g in groups[1:]:
            drafts.append(apply(drafts[-1], g))
        if i + 1 == len(req.steps) or output_length(drafts[0], s) is not None:
            req.move(drafts[0], 1)  # X^1 is certain and ends the output: no forward
            self.current = None
            return None
        live = [x for k, x in enumerate(drafts) if i + k + 1 < len(req.steps)]
        self._drafts = (groups, drafts)
        return Plan(torch.stack(live), req.window(i + 1, i + len(live), d - 1),
                    i + 1, len(live) - 1)

    def room(self, req) -> int:
        """Drafts beyond X^1 the next plan can use; none while it has no current logits."""
        if self.current is None:
            return 0
        return min(self.s.draft_steps, len(req.steps) - req.i) - 1

    def advance(self, req, plan, logits) -> None:
        """logits: one ``NodeLogits`` per node of ``plan``."""
        if self._drafts is None:
            self.current = logits[0]
            return
        groups, drafts = self._drafts
        live, m = plan.nodes.shape[0], 0
        # verify X^{m+2} against the baseline's decision at X^{m+1} (row m, step i+m+1)
        while m + 1 < len(drafts) and m < live:
            d = decide_at(drafts[m], req.steps[req.i + m + 1], logits[m], self.s, req.seed)
            if d != groups[m + 1]:
                break
            m += 1
        req.move(drafts[m], m + 1)
        self.current = logits[m] if m < live else None
