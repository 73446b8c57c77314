"""Per-request dLLM block decoding: one state machine, three policies that decode identically.

* ``stepwise`` -- the baseline: one forward per step of the schedule (``dllm_blocks``).
* ``ssd`` -- Self Speculative Decoding (``ssd.py``, SSD Algorithm 1): a chain of drafted
  steps verified in one batched forward.
* ``freedave`` -- Free Draft-and-Verification (``freedave.py``, FreeDave Algorithm 2).

Guarantee: for the same prompt, settings and seed, the three produce the same tokens. Each
forward evaluates some canvases (nodes) and every step that gets committed is the baseline's
own decision at that canvas, recomputed from that canvas's logits (drafts are only guesses of
which canvases to evaluate); the randomness is keyed by the step, not the forward. Exact in
exact arithmetic, so it holds token for token whenever a canvas's logits do not depend on
what else shares its batch (true up to floating-point rounding; near-ties aside, identical).
And they never need more forwards than ``stepwise``: every forward evaluates a canvas the
baseline path has to pass through and that no earlier forward evaluated.

How an engine drives a request (``generate`` below does it with a PyTorch model)::

    plan = req.plan()          # None: finished (FreeDave can finish without a forward)
                               # req.plan(limit): at most ``limit`` drafted nodes this round
    logits = <forward plan.nodes>  # [n_nodes, w1 - w0, V]: row r predicts generated position w0 + r
    req.advance(logits)        # or, for a batch of requests, ``advance_all``
    ... until req.finished; req.output()

The canvases' logits must come from one fixed *cache policy* for all three methods (see
``dllm_cache.BlockEvaluator``: ``prefix`` = block-causal attention with committed blocks' KV
reused, ``none`` = full bidirectional recompute).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .dllm_blocks import DllmSettings, Plan, apply, block_span, output_length, schedule
from .dllm_scores import NodeLogits, decide_at, prefetch
from .freedave import FreeDave
from .ssd import Ssd


@dataclass(frozen=True)
class DllmOutput:
    tokens: list[int]  # generated tokens, through the first EOS
    finish_reason: str  # "stop" (ended at EOS) or "length"
    forwards: int  # model forwards (a batched verification forward counts once)
    steps: int  # baseline steps the canvas had advanced when decoding stopped
    nodes: int  # canvases evaluated over all forwards


class Stepwise:
    """The baseline: evaluate the current canvas, take one step."""

    def __init__(self, s: DllmSettings) -> None:
        self.s = s

    def plan(self, req: "DllmRequest", limit: int | None = None) -> Plan:
        return Plan(req.canvas[None], req.window(req.i, req.i), req.i)

    def room(self, req: "DllmRequest") -> int:
        return 0

    def advance(self, req: "DllmRequest", plan: Plan, nodes: list[NodeLogits]) -> None:
        d = decide_at(req.canvas, req.steps[req.i], nodes[0], self.s, req.seed)
        req.move(apply(req.canvas, d), 1)


class DllmRequest:
    """One request: the canvas, its place in the schedule, counters, and the policy."""

    def __init__(self, prompt: list[int], s: DllmSettings, seed: int = 0) -> None:
        if len(prompt) == 0:
            raise ValueError("dLLM decoding needs a non-empty prompt")
        self.prompt = torch.tensor(list(prompt), dtype=torch.long)
        self.s, self.seed = s, seed
        self.steps = schedule(s)
        self.canvas = torch.full((s.max_tokens,), s.mask_id, dtype=torch.long)
        self.i = 0  # baseline steps taken: the canvas is the baseline's after i steps
        self.forwards = self.nodes = 0
        self.length: int | None = None  # output length once determined
        self.policy = {"stepwise": Stepwise, "ssd": Ssd, "freedave": FreeDave}[s.method](s)
        self._plan: Plan | None = None

    @property
    def finished(self) -> bool:
        return self.length is not None

    @property
    def last_plan(self) -> Plan | None:
        """The plan whose logits ``advance`` expects next."""
        return self._plan

    def plan(self, limit: int | None = None) -> Plan | None:
        """The canvases of the next forward. ``limit``: at most that many drafted steps beyond
        node 0 this round (the speculation budget's cap; None: the configured size; 0: one
        node, the baseline's forward). Any limits, round by round, decode the same tokens:
        drafts only choose which canvases to evaluate, and the policy's state (SSD's draft
        logits, FreeDave's current logits) is refreshed by every forward, drafted or not."""
        self._plan = None if self.finished else self.policy.plan(self, limit)
        return self._plan

    def draft_room(self) -> int:
        """The most drafted steps the next ``plan`` can use (0 where it cannot draft: the
        baseline, a policy without draft logits yet); ``plan(draft_room())`` is ``plan()``."""
        return 0 if self.finished else self.policy.room(self)

    def advance(self, logits) -> None:
        """Fold in the logits of the last plan's nodes: [n_nodes, w1 - w0, V], or those
        wrapped per node (``node_logits``)."""
        plan = self._plan
        n, w = (plan.nodes.shape[0], plan.window[1] - plan.window[0]) if plan else (0, 0)
        nodes = self.node_logits(logits) if torch.is_tensor(logits) else logits
        if plan is None or len(nodes) != n or any(x.logits.shape[0] != w for x in nodes):
            raise ValueError("advance() needs the logits of the last plan's nodes and window")
        self.forwards += 1
        self.nodes += n
        self._plan = None
        self.policy.advance(self, plan, nodes)

    def node_logits(self, logits) -> list[NodeLogits]:
        """[n_nodes, w1 - w0, V] logits of the last plan -> one NodeLogits per node."""
        w0 = self._plan.window[0] if self._plan is not None else 0  # else: advance refuses
        return [NodeLogits(lg, w0) for lg in logits]

    # ----------------------------------------------------------------- for the policies
    def move(self, canvas, steps: int) -> None:
        """Commit the baseline's canvas ``steps`` steps further on."""
        self.canvas, self.i = canvas, self.i + steps
        self.length = output_length(canvas, self.s)
        if self.i == len(self.steps) and self.length is None:
            raise AssertionError("schedule exhausted with masked positions left")

    def window(self, first: int, last: int, reach: int = 0) -> tuple[int, int]:
        """Logit window for nodes at steps first..last: their blocks, plus the blocks of the
        ``reach`` steps after ``last`` (at most ``lookahead_blocks`` further), which the next
        round's drafts read from these logits. A forward costs its window's rows, so a block
        no draft will read is not computed: a round that drafts nothing (``reach`` 0) has
        the baseline's window."""
        last_block = self.steps[last].block
        far = self.steps[min(last + reach, len(self.steps) - 1)].block
        lo = block_span(self.s, self.steps[first].block)[0]
        return lo, block_span(self.s, min(far, last_block + self.s.lookahead_blocks))[1]

    def output(self) -> DllmOutput:
        n = self.length if self.length is not None else 0
        tokens = self.canvas[:n].tolist()
        stop = self.s.eos_id is not None and bool(tokens) and tokens[-1] == self.s.eos_id
        return DllmOutput(tokens, "stop" if stop else "length", self.forwards, self.i,
                          self.nodes)


def advance_all(rounds: list[tuple[DllmRequest, object]]) -> None:
    """Fold one round's logits into its requests: (request, [n_nodes, w1 - w0, V] logits of its
    last plan). The rows every node 0 is certain to read are scored in one batch first
    (``dllm_scores.prefetch``); the decisions are the same as ``req.advance`` one by one."""
    nodes = [req.node_logits(lg) for req, lg in rounds]
    prefetch([(req, req.last_plan, n) for (req, _), n in zip(rounds, nodes)
              if req.last_plan is not None])
    for (req, _), n in zip(rounds, nodes):
        req.advance(n)


def generate(model, prompts: list[list[int]], s: DllmSettings, seeds: list[int] | None = None,
             cache: str = "prefix", limit=None) -> list[DllmOutput]:
    """Decode a batch of requests in lock-step rounds; each round is ONE model forward over
    every unfinished request's nodes (padded), and counts as one forward for each of them.
    ``limit(request) -> int | None``: its draft limit this round (``plan(limit)``; tests)."""
    from .dllm_cache import BlockEvaluator

    seeds = list(seeds) if seeds is not None else [0] * len(prompts)
    reqs = [DllmRequest(p, s, seed) for p, seed in zip(prompts, seeds, strict=True)]
    evaluator = BlockEvaluator(model, s, cache)
    while True:
        jobs = []
        for r in reqs:
            if not r.finished:
                plan = r.plan(None if limit is None else limit(r))
                if plan is None:  # finished without a forward (FreeDave): free its cache
                    evaluator.commit(r)
                else:
                    jobs.append((r, plan))
        if not jobs:
            break
        advance_all([(r, logits) for (r, _), logits in zip(jobs, evaluator(jobs))])
        for r, _ in jobs:
            evaluator.commit(r)
    return [r.output() for r in reqs]
