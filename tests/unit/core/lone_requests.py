"""A simulated engine for the budget controller's tests at batch 1 (not a test module):
requests of 128 tokens one after another, as ``bench_switch --batch 1`` runs them, after the
steps at batch 2 an engine's first closed batch runs; a drafting step has a fixed price at any
depth (``specdiff``'s drafter forward). Each draft is accepted with probability ``accept``
after its predecessor, except in the requests of ``loops``, which loop where the drafter
cannot follow: their third draft and beyond are never accepted."""

from __future__ import annotations

import random

from vllm_anyorder.core.budget import BudgetController
from vllm_anyorder.core.budget_settings import BudgetSettings


def lone_requests(steps: int, seed: int, mode: str = "auto", *, most: int = 8,
                  loops: tuple[int, ...] = (), warm_drafting: int = 0,
                  drafting: tuple[float, float] = (0.0116, 0.00003), plain: float = 0.0050,
                  noise: float = 0.04, accept: float = 0.8) -> tuple[float, int]:
    """(seconds, tokens) of ``steps`` steps at batch 1, drafts capped at ``most`` a step.

    Before them, 20 plain steps at batch 2 (6.9 ms: they price a plain row) and then
    ``warm_drafting`` steps of four drafts each (10 rows, 14.5 ms and 0.2 ms a draft). A
    drafting step at batch 1 costs ``drafting[0] + drafting[1] * k`` seconds for k drafts,
    a plain one ``plain``; every step times ``1 + noise * U(0, 1)``."""
    rng = random.Random(seed)
    ctl = BudgetController(BudgetSettings(max_drafts=8, mode=mode), lambda depth: 1)
    for i in range(20 + warm_drafting):
        caps = ctl.allot(["a", "b"], [4, 4] if i >= 20 else [0, 0])
        committed = 2
        for rid, k in zip(["a", "b"], caps):
            accepted = 0
            while accepted < k and rng.random() < accept:
                accepted += 1
            if k:
                ctl.record_verified(rid, k, accepted)
            committed += accepted
        seconds = 0.0145 + 0.0002 * sum(caps) if any(caps) else 0.0069
        ctl.record_step(2 + sum(caps), any(caps), seconds * (1 + 0.04 * rng.random()), 2,
                        committed)
    seconds, tokens, request, made = 0.0, 0, 0, 0
    for _ in range(steps):
        rid = f"r{request}"
        k = ctl.allot([rid], [min(most, 127 - made)])[0]
        looping = request in loops
        accepted = 0
        while accepted < k and (accepted < 2 or not looping) and rng.random() < accept:
            accepted += 1
        if k:
            ctl.record_verified(rid, k, accepted)
        step = (drafting[0] + drafting[1] * k if k else plain) * (1 + noise * rng.random())
        ctl.record_step(1 + k, bool(k), step, 1, 1 + accepted)
        seconds, tokens, made = seconds + step, tokens + 1 + accepted, made + 1 + accepted
        if made >= 128:
            request, made = request + 1, 0
    return seconds, tokens


def speed(steps: int, seed: int, mode: str = "auto", **kw) -> float:
    """Committed tokens per second of :func:`lone_requests`."""
    seconds, tokens = lone_requests(steps, seed, mode, **kw)
    return tokens / seconds
