"""Slow, obviously-correct decoders for the Jacobi core (no KV cache, no vLLM).

``forward(tokens) -> argmax list`` re-runs the whole sequence each call: entry j is the
model's argmax for position j+1 given tokens[: j+1].
"""

from __future__ import annotations

from typing import Callable

from vllm_anyorder.core.jacobi import JacobiSettings, JacobiState

Forward = Callable[[list[int]], list[int]]


def greedy_decode(forward: Forward, prompt: list[int], max_new: int, eos: int | None = None):
    out: list[int] = []
    for _ in range(max_new):
        tok = forward(prompt + out)[-1]
        out.append(tok)
        if tok == eos:
            break
    return out


def jacobi_decode(forward: Forward, prompt: list[int], max_new: int, settings: JacobiSettings,
                  eos: int | None = None):
    """Prefill, then one verification forward per step over [context, chain]; greedy
    acceptance of the longest matching prefix + the argmax at the first mismatch."""
    first = forward(prompt)[-1]
    ctx, forwards = prompt + [first], 1
    state = JacobiState(settings, ctx)
    while len(ctx) - len(prompt) < max_new and ctx[-1] != eos:
        chain = state.next_chain()
        rows = forward(ctx + chain)[len(ctx) - 1 :]  # row i predicts position len(ctx)+i
        forwards += 1
        m = 0
        while m < len(chain) and chain[m] == rows[m]:
            m += 1
        committed = chain[:m] + [rows[m]]
        state.advance(chain, rows, committed)
        ctx += committed
    out = ctx[len(prompt) :]
    if eos is not None and eos in out:
        out = out[: out.index(eos) + 1]
    return out[:max_new], forwards, state


def hf_forward(model) -> Forward:
    """Wrap a transformers causal LM as a full-recompute argmax forward."""
    import torch

    @torch.no_grad()
    def forward(tokens: list[int]) -> list[int]:
        return model(torch.tensor([tokens])).logits[0].argmax(-1).tolist()

    return forward


def recurrence_forward(vocab: int, a: int = 5, b: int = 3, c: int = 1) -> Forward:
    """A synthetic deterministic 'model': x_{t+1} = (a*x_t + b*x_{t-1} + c) mod vocab.
    Its greedy sequences are periodic, so drafts from the context and the pool get accepted."""

    def forward(tokens: list[int]) -> list[int]:
        prev = [tokens[0]] + tokens[:-1]
        return [(a * x + b * p + c) % vocab for x, p in zip(tokens, prev)]

    return forward
