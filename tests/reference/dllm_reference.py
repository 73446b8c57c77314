"""Slow, plain dLLM block decoders: the baseline the core's three methods must reproduce.

Written independently of ``vllm_anyorder.core.dllm*`` (only the seeded random draws are shared:
they are the definition of "the same randomness"). One canvas, one step per model call:

* ``nocache_decode`` -- full recompute of prompt + the whole canvas every step, full
  bidirectional attention (LLaDA's ``generate``): the ``none`` cache policy.
* ``blockcausal_decode`` -- full recompute every step with the block-causal mask (a row sees
  blocks up to its own; the prompt is block -1): what the ``prefix`` policy must equal.
* ``cached_decode`` -- the ``prefix`` policy written plainly with a KV cache: rows of blocks
  completed before the active one are computed together with it in its first forward and then
  cached; later steps run only the active block over the cache.

Each returns (tokens through the first EOS, model calls).
"""

from __future__ import annotations

import torch

from vllm_anyorder.core.dllm_blocks import GUMBEL_STREAM, REMASK_STREAM, uniform


def step_counts(n: int, steps: int) -> list[int]:
    """LLaDA's get_num_transfer_tokens for one block of n masked positions."""
    return [n // steps + (1 if k < n % steps else 0) for k in range(steps)]


def plain_step(x, lo, hi, logits_of, t, count, s, seed) -> None:
    """Unmask ``count`` positions of block [lo, hi) of canvas ``x`` (a list) in place."""
    cands = []
    for p in range(lo, hi):
        if x[p] != s.mask_id:
            continue
        lg = logits_of(p).double().clone()
        lg[s.mask_id] = float("-inf")
        score = lg
        if s.temperature > 0:
            u = uniform(seed, GUMBEL_STREAM, t, torch.tensor([p]), lg.numel())[0]
            score = lg / s.temperature - torch.log(-torch.log(u))
        tok = int(torch.argmax(score))
        if s.remasking == "low_confidence":
            conf = float(torch.softmax(lg, -1)[tok])
        else:
            conf = float(uniform(seed, REMASK_STREAM, t, torch.tensor([p]))[0])
        cands.append((-conf, p, tok))
    for _, p, tok in sorted(cands)[:count]:
        x[p] = tok


def finished_length(x, s) -> int | None:
    for p, tok in enumerate(x):
        if tok == s.mask_id:
            return None
        if s.eos_id is not None and tok == s.eos_id:
            return p + 1
    return len(x)


def _blocks(s):
    for b in range(-(-s.max_tokens // s.block_length)):
        lo, hi = b * s.block_length, min((b + 1) * s.block_length, s.max_tokens)
        for k, count in enumerate(step_counts(hi - lo, s.steps_per_block)):
            if count:
                yield lo, hi, b * s.steps_per_block + k, count


def _block_of(a: int, prompt_len: int, block_length: int) -> int:
    return -1 if a < prompt_len else (a - prompt_len) // block_length


def _full_decode(model, prompt, s, seed, block_causal: bool):
    x, n, calls = [s.mask_id] * s.max_tokens, len(prompt), 0
    total = n + s.max_tokens
    blk = [_block_of(a, n, s.block_length) for a in range(total)]
    mask = None
    if block_causal:
        mask = torch.tensor([[blk[j] <= blk[i] for j in range(total)] for i in range(total)])[None]
    for lo, hi, t, count in _blocks(s):
        seq = torch.tensor([list(prompt) + x])
        logits, _ = model.forward(seq, torch.arange(total)[None], None, mask, shift=True)
        calls += 1
        plain_step(x, lo, hi, lambda p: logits[0, n + p], t, count, s, seed)
        if (length := finished_length(x, s)) is not None:
            return x[:length], calls
    raise AssertionError("unreachable: the last step decides every position")


def nocache_decode(model, prompt, s, seed=0):
    return _full_decode(model, prompt, s, seed, block_causal=False)


def blockcausal_decode(model, prompt, s, seed=0):
    return _full_decode(model, prompt, s, seed, block_causal=True)


def cached_decode(model, prompt, s, seed=0):
    x, n, calls = [s.mask_id] * s.max_tokens, len(prompt), 0
    shift = getattr(model, "logit_shift", 0)
    cache, cached, anchor = None, 0, None  # per-layer (k, v); rows cached; raw logits of last
    for lo, hi, t, count in _blocks(s):
        seq = list(prompt) + x
        rows = list(range(cached, n + hi))
        blk = [_block_of(a, n, s.block_length) for a in rows]
        mask = torch.tensor([[True] * cached + [blk[j] <= blk[i] for j in range(len(rows))]
                             for i in range(len(rows))])[None]
        raw, kv = model.forward(torch.tensor([seq[cached: n + hi]]), torch.tensor([rows]),
                                cache, mask, shift=False)
        calls += 1

        def logits_of(p, raw=raw, base=cached):
            a = n + p - shift  # the row whose logits predict generated position p
            return raw[0, a - base] if a >= base else anchor

        plain_step(x, lo, hi, logits_of, t, count, s, seed)
        done = n + lo - cached  # rows before the active block are final: cache them
        if done > 0:
            new = [(k[:, :done], v[:, :done]) for k, v in kv]
            cache = new if cache is None else [
                (torch.cat([k0, k1], 1), torch.cat([v0, v1], 1))
                for (k0, v0), (k1, v1) in zip(cache, new)]
            anchor, cached = raw[0, done - 1], n + lo
        if (length := finished_length(x, s)) is not None:
            return x[:length], calls
    raise AssertionError("unreachable: the last step decides every position")
