"""Semi-autoregressive block decoding of diffusion LLMs: schedule, seeded transition rule, drafts.

The baseline every policy here reproduces is static stepwise decoding as in LLaDA's
``generate`` (SSD Sec. 3.1, FreeDave Algorithm 1): the ``max_tokens`` generated positions start
as the mask token and are split into blocks of ``block_length`` decoded left to right; block j
gets ``steps_per_block`` denoising steps and step k unmasks ``count`` tokens (LLaDA's rule:
``n // S`` each, the first ``n % S`` steps one more; steps that unmask nothing are skipped, they
change nothing). One step, given the logits of the current canvas at the block's masked
positions (``decide``):

1. x0 = argmax(logits) at temperature 0, else argmax(logits / T + Gumbel noise) (the Gumbel-max
   form of LLaDA's ``exp(logits) / (-log u)^T``); the mask token itself is never chosen.
2. confidence = softmax(logits)[x0] ("low_confidence" remasking: keep the most confident), or a
   uniform draw ("random").
3. the ``count`` most confident masked positions of the block take their x0; ties go to the
   lower position.

Randomness is a counter-based hash of (seed, stream, step, position[, vocab id]), so a
decision depends only on the request seed and *which* step of the schedule it is -- never on
how many forwards ran before. That is what lets SSD and FreeDave, which skip ahead along the
schedule, make exactly the baseline's decisions at temperature > 0 too. The step key is the
nominal index ``block * steps_per_block + k``; the position key is the generated index.

Canvases are 1-D long tensors over the generated positions only (the prompt is not part of
them). A decoded output ends at the first EOS once every position before it is decided.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

REMASKING = ("low_confidence", "random")
METHODS = ("stepwise", "ssd", "freedave")
GUMBEL_STREAM, REMASK_STREAM = 0x6A09E667, 0x3C6EF372  # keys of the two random draws


@dataclass(frozen=True)
class DllmSettings:
    mask_id: int
    max_tokens: int  # generated positions (the canvas length)
    block_length: int = 32
    steps_per_block: int = 32
    temperature: float = 0.0
    remasking: str = "low_confidence"  # one of REMASKING
    eos_id: int | None = None
    method: str = "stepwise"  # one of METHODS
    draft_length: int = 4  # SSD: N drafted steps -> a chain of N+1 nodes
    mix_order: bool = False  # SSD Sec. 5.2: also verify each node's grandchild out of order
    draft_steps: int = 4  # FreeDave: d drafted steps -> d nodes
    lookahead_blocks: int = 1  # drafting may reach this many blocks past the last node's block

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.block_length < 1 or self.steps_per_block < 1:
            raise ValueError("max_tokens, block_length and steps_per_block must be >= 1")
        if self.remasking not in REMASKING:
            raise ValueError(f"remasking must be one of {REMASKING}, got {self.remasking!r}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.temperature < 0 or self.draft_length < 0 or self.draft_steps < 1 \
                or self.lookahead_blocks < 0:
            raise ValueError("temperature, draft_length, lookahead_blocks must be >= 0 and "
                             "draft_steps >= 1")
        if self.eos_id is not None and self.eos_id == self.mask_id:
            raise ValueError("eos_id must differ from mask_id")


@dataclass(frozen=True)
class Step:
    index: int  # nominal step t = block * steps_per_block + k: keys the randomness
    block: int
    count: int  # tokens this step unmasks (> 0)


def schedule(s: DllmSettings) -> tuple[Step, ...]:
    """The baseline's steps in order, over every block (zero-count steps dropped)."""
    steps = []
    for b in range(-(-s.max_tokens // s.block_length)):
        n = block_span(s, b)[1] - block_span(s, b)[0]
        base, extra = divmod(n, s.steps_per_block)
        for k in range(s.steps_per_block):
            if base + (k < extra):
                steps.append(Step(b * s.steps_per_block + k, b, base + (k < extra)))
    return tuple(steps)


def block_span(s: DllmSettings, block: int) -> tuple[int, int]:
    """[start, end) of a block in generated coordinates (the last block may be shorter)."""
    return block * s.block_length, min((block + 1) * s.block_length, s.max_tokens)


@dataclass(frozen=True)
class Plan:
    """What one forward of a request evaluates."""

    nodes: torch.Tensor  # [n, max_tokens] long: canvases, evaluated in one batched forward
    window: tuple[int, int]  # [w0, w1): generated positions whose logits are needed
    first_step: int = -1  # schedule index of the step node 0's logits are sure to decide (-1: none)
    drafted: int = 0  # drafted steps evaluated beyond node 0 (the speculation budget's unit)


# ----------------------------------------------------------------------------- randomness
_M32 = 0xFFFFFFFF


def _mul32(x, m: int):
    """(x * m) mod 2^32 for x in [0, 2^32), in int64 without overflow."""
    return (x * (m & 0xFFFF) + (((x * (m >> 16)) & 0xFFFF) << 16)) & _M32


def _mix32(x):
    """A 32-bit avalanche bijection (xorshift-multiply finalizer)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _absorb(h, value):
    """Fold one key field into the hash (Python ints and int64 tensors alike)."""
    return _mix32((h + _mul32(value & _M32, 0x9E3779B9)) & _M32)


def uniform(seed: int, stream: int, step: int, positions, width: int | None = None):
    """Uniform (0, 1) float64 draws keyed by (seed, stream, step, position[, 0..width-1]):
    shape [n] or [n, width]. Same key, same value, whatever else is drawn."""
    h = 0x243F6A88
    for v in (seed & _M32, (seed >> 32) & _M32, stream, step):  # scalars: plain ints
        h = _absorb(h, int(v))
    h = _absorb(h, positions.long())  # [n]
    if width is not None:
        h = _absorb(h[:, None], torch.arange(width, device=h.device))  # [n, width]
    return (h.double() + 0.5) / 2.0 ** 32


def gumbel(seed: int, step: int, positions, width: int):
    return -torch.log(-torch.log(uniform(seed, GUMBEL_STREAM, step, positions, width)))


# ----------------------------------------------------------------------------- one step
@dataclass(frozen=True)
class Decision:
    """What one step unmasks: positions (ascending, generated coordinates) and their tokens."""

    positions: tuple[int, ...]
    tokens: tuple[int, ...]


def row_scores(logits, mask_id: int):
    """x0 = argmax and confidence = softmax at x0, in float64 with the mask token excluded, for
    each row of ``logits`` [n, V] -> (x0 [n] long, conf [n] float64). Every reduction here is
    per row, so a row scores the same alone or among others (``dllm_scores`` batches them)."""
    lg = logits.to(torch.float64, copy=True)
    lg[:, mask_id] = float("-inf")
    x0 = lg.argmax(-1)
    return x0, torch.softmax(lg, -1).gather(-1, x0[:, None])[:, 0]


def select(positions, x0, conf, count: int) -> Decision:
    """Step 3 of the rule: the ``count`` most confident positions (ties: lower position).
    On Python floats (the float64 values themselves): a stable sort, a block at most long."""
    c = conf.tolist()
    keep = sorted(sorted(range(len(c)), key=c.__getitem__, reverse=True)[:count])
    pos, tok = positions.tolist(), x0.tolist()
    return Decision(tuple(pos[j] for j in keep), tuple(tok[j] for j in keep))


def decide(logits, positions, step: Step, s: DllmSettings, seed: int) -> Decision:
    """The baseline's transition at one step. logits [n, V] at the block's masked positions
    ``positions`` [n] (ascending)."""
    if s.temperature > 0:
        lg = logits.to(torch.float64, copy=True)
        lg[:, s.mask_id] = float("-inf")
        noise = gumbel(seed, step.index, positions.to(lg.device), lg.shape[-1])
        x0 = (lg / s.temperature + noise).argmax(-1)
        conf = torch.softmax(lg, -1).gather(-1, x0[:, None])[:, 0]
    else:
        x0, conf = row_scores(logits, s.mask_id)
    if s.remasking == "random":
        conf = uniform(seed, REMASK_STREAM, step.index, positions.to(x0.device))
    return select(positions, x0, conf, step.count)


def apply(canvas, d: Decision):
    out = canvas.clone()
    out[list(d.positions)] = torch.tensor(d.tokens, dtype=canvas.dtype)
    return out


def masked_in_block(canvas, s: DllmSettings, block: int):
    lo, hi = block_span(s, block)
    return (canvas[lo:hi] == s.mask_id).nonzero()[:, 0] + lo


def output_length(canvas, s: DllmSettings) -> int | None:
    """Length of the output once it is determined: through the first EOS when every position
    before it is decided, ``max_tokens`` when nothing is masked, else None."""
    masked = canvas == s.mask_id
    if s.eos_id is not None:
        eos = (canvas == s.eos_id).nonzero()
        if eos.numel() and not bool(masked[: int(eos[0, 0])].any()):
            return int(eos[0, 0]) + 1
    return None if bool(masked.any()) else s.max_tokens
