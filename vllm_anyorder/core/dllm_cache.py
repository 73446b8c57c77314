"""Evaluating dLLM plans with a PyTorch model under a cache policy (the engine-free forward).

Every method (stepwise, SSD, FreeDave) must see the same logits for the same canvas, so the
cache policy is a property of the *evaluator*, shared by all of them:

``prefix`` (default) -- **block-causal attention with committed blocks' KV reused.** A row in
    block b attends to every position in blocks <= b (the prompt is block -1 and attends only
    to itself). So a block's keys/values depend only on the blocks up to it, and once a block
    is complete they are final: they are computed once (in the forward that first sees the
    block complete, fused with the next block's rows) and cached; the active block is always
    recomputed with full bidirectional attention to itself and the cached prefix. This equals
    a full recompute of the whole sequence with the block-causal mask, exactly. Compared with
    ``none`` it differs in one thing: the prompt and committed blocks do not see later blocks
    (not even as masks), and the active block does not see the masks after it.
    For a model with a logit shift (Dream), position p is read from row p-1; for the first
    position of a block that row is the last committed row, so its (raw) logits are kept with
    the cache -- under block-causal attention they never change.

``none`` -- **full recompute**: every forward runs the prompt plus the whole canvas (every
    future block as masks) with full bidirectional attention, as LLaDA's and Dream's own
    ``generate`` do. Nothing is cached.

Batching: all nodes of all requests in a round go through ONE model call, padded; padding rows
and keys are masked out.
"""

from __future__ import annotations

import torch

from .dllm_blocks import DllmSettings

CACHE_POLICIES = ("prefix", "none")


class _Cache:
    def __init__(self) -> None:
        self.length = 0  # absolute rows cached: the prompt, then complete blocks
        self.kv = None  # per layer (k, v) [length, kv_heads, head_dim]
        self.anchor = None  # raw logits [V] of row length-1 (models with a logit shift)
        self.last = None  # (row0, tokens [n, L], kv per layer [n, L, ...], {row: raw [n, V]})


class BlockEvaluator:
    """``evaluator(jobs)`` with jobs = [(request, plan)] -> per job logits [n, w1 - w0, V]."""

    def __init__(self, model, s: DllmSettings, policy: str = "prefix") -> None:
        if policy not in CACHE_POLICIES:
            raise ValueError(f"cache policy must be one of {CACHE_POLICIES}, got {policy!r}")
        self.model, self.s, self.policy = model, s, policy
        self.shift = int(getattr(model, "logit_shift", 0))
        self.caches: dict[int, _Cache] = {}

    def _block_ids(self, prompt_len: int, rows):
        return torch.where(rows < prompt_len, -1, (rows - prompt_len) // self.s.block_length)

    def __call__(self, jobs):
        s, specs = self.s, []
        for req, plan in jobs:
            c = self.caches.setdefault(id(req), _Cache())
            p = len(req.prompt)
            r0 = c.length if self.policy == "prefix" else 0
            r1 = p + (plan.window[1] if self.policy == "prefix" else s.max_tokens)
            if p + plan.window[0] < r0:
                raise AssertionError("plan window starts inside the cached prefix")
            full = torch.cat([req.prompt.expand(plan.nodes.shape[0], -1), plan.nodes], 1)
            rows = torch.arange(r0, r1)
            blk = self._block_ids(p, rows)
            new = blk[None, :] <= blk[:, None] if self.policy == "prefix" else \
                torch.ones(len(rows), len(rows), dtype=torch.bool)
            specs.append((c, r0, rows, full[:, r0:r1], new))
        n_tot = sum(t.shape[0] for *_, t, _ in specs)
        l_max = max(len(r) for _, _, r, _, _ in specs)
        c_max = max(c.length if self.policy == "prefix" else 0 for c, *_ in specs)
        tokens = torch.full((n_tot, l_max), s.mask_id, dtype=torch.long)
        positions = torch.zeros((n_tot, l_max), dtype=torch.long)
        mask = torch.zeros((n_tot, l_max, c_max + l_max), dtype=torch.bool)
        past = None
        if c_max:
            ref = next(c.kv for c, *_ in specs if c.kv is not None)
            past = [(k.new_zeros((n_tot, c_max) + k.shape[1:]),
                     v.new_zeros((n_tot, c_max) + v.shape[1:])) for k, v in ref]
        b = 0
        for c, r0, rows, toks, new in specs:
            n, length = toks.shape
            tokens[b:b + n, :length], positions[b:b + n, :length] = toks, rows
            mask[b:b + n, :length, c_max:c_max + length] = new
            if r0:  # the cached prefix: visible to every row
                mask[b:b + n, :length, :r0] = True
                for (pk, pv), (k, v) in zip(past, c.kv):
                    pk[b:b + n, :r0], pv[b:b + n, :r0] = k, v
            b += n
        raw, new_kv = self.model.forward(tokens, positions, past, mask, shift=False)
        out, b = [], 0
        for (req, plan), (c, r0, rows, toks, _) in zip(jobs, specs):
            n, length = toks.shape
            p = len(req.prompt)
            lg = raw[b:b + n, :length]
            ends = {int(a): lg[:, a - r0] for a in rows if self._is_block_end(p, int(a))} \
                if self.shift else {}
            c.last = (r0, toks, [(k[b:b + n, :length], v[b:b + n, :length]) for k, v in new_kv],
                      ends)
            src = torch.arange(p + plan.window[0], p + plan.window[1]) - self.shift - r0
            if int(src[0]) < 0:  # the row before the window is the last cached one
                lg = torch.cat([c.anchor.expand(n, 1, -1), lg], 1)
                src = src + 1
            out.append(lg[:, src])
            b += n
        return out

    def _is_block_end(self, prompt_len: int, a: int) -> bool:
        g = a + 1 - prompt_len  # generated positions before row a+1
        return g == 0 or (g > 0 and (g % self.s.block_length == 0 or g == self.s.max_tokens))

    def commit(self, req) -> None:
        """After ``req.advance``: cache the rows of newly complete blocks when the last forward
        computed them for a canvas that agrees with the committed one there (block-causal: then
        they are exactly the rows the committed canvas has). Otherwise the next forward
        recomputes them alongside the active block. Frees everything once ``req`` finished."""
        if req.finished:
            self.caches.pop(id(req), None)
            return
        c = self.caches[id(req)]
        last, c.last = c.last, None
        if self.policy != "prefix" or last is None:
            return
        masked = (req.canvas == self.s.mask_id).nonzero()
        done = int(masked[0, 0]) // self.s.block_length * self.s.block_length \
            if masked.numel() else self.s.max_tokens
        p = len(req.prompt)
        end = p + done
        r0, toks, kv, ends = last
        if end <= c.length or end - r0 > toks.shape[1]:
            return
        full = torch.cat([req.prompt, req.canvas])[r0:end]
        hit = (toks[:, : end - r0] == full).all(1).nonzero()
        if not hit.numel():
            return
        j, n = int(hit[0, 0]), end - r0
        rows = [(k[j, :n], v[j, :n]) for k, v in kv]
        c.kv = rows if c.kv is None else [(torch.cat([k0, k1]), torch.cat([v0, v1]))
                                         for (k0, v0), (k1, v1) in zip(c.kv, rows)]
        if self.shift:
            c.anchor = ends[end - 1][j]
        c.length = end
