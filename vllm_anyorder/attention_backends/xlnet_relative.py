"""XLNet's relative-position two-stream attention over vLLM's paged KV cache (CPU).

XLNet (Yang et al., 2019), the model family of Guo & Ermon's AS-ARM checkpoints (App. D),
has no absolute positions in its token stream: query row i (position a_i) scores key j
(position b_j) as

    s_ij = scale * [ (q_i + r_w_bias) . k_j  +  (q_i + r_r_bias) . R(a_i - b_j) ]

with R(d) = [sin(d w), cos(d w)] @ W_r per head (``attn_type="bi"``, distances clamped to
``clamp_len`` when it is > 0). XLNet's segment term is left out: an AS-ARM request is one
segment, where that term is the same for every key of a row and cancels in the softmax.
The second term needs the *key's position*, which vLLM's stock CPU op never sees, so this
backend computes attention itself (PyTorch over the paged cache):

* **Cache.** The stock CPU cache tensor (``[num_blocks, kv_heads, block_size, 2 * head]``,
  allocated by vLLM as for any CPU attention layer) holds key | value of token slot
  ``block * block_size + offset`` at ``[block, :, offset]``; :func:`write_kv` writes it.
  A per-model slot -> position table (:class:`SlotPositions`) records each key's true
  position when it is written (the sequence index, or an infill request's table entry).
* **Masks.** The AS-ARM metadata builder (``asarm_cpu``) is reused as is: per group of rows
  a request's block-table row, ``seq_len`` and a causal flag (the prompt attends to the
  whole prompt, generated rows causally; query rows: the forward's query plan, or the
  proposer's prefix metadata). Row r of a group with q rows and seq_len s sees keys
  [0, s - q + r] when causal, [0, s) otherwise (the stock op's rule).
* **Two streams.** Content rows write K/V and read; query rows (``mask_emb``, positioned at
  the token they predict) only read: XLNet's query stream attends to the content of the
  tokens decoded before its target.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_anyorder.attention_backends.asarm_cpu import AsArmCPUBackend


class XLNetCPUBackend(AsArmCPUBackend):
    """Per-layer backend of the XLNet AS-ARM: vLLM allocates the CPU cache layout and builds
    AS-ARM metadata; reads and writes are :func:`write_kv` / :func:`paged_relative_attention`
    (the model never calls the stock op)."""


def sinusoid(distances: torch.Tensor, d_model: int) -> torch.Tensor:
    """XLNet's relative encoding of ``distances`` [N] -> [N, d_model] = [sin(d w), cos(d w)],
    w_f = 10000^(-2f / d_model) (``XLNetModel.relative_positional_encoding``)."""
    inv_freq = 1.0 / torch.pow(10000.0, torch.arange(0, d_model, 2.0) / d_model)
    angle = distances.to(torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angle.sin(), angle.cos()], dim=-1)


def relative_key_table(w_r: torch.Tensor, max_distance: int, clamp_len: int = -1
                       ) -> torch.Tensor:
    """R(d) for d in [-max_distance, max_distance]: [2 * max_distance + 1, heads, head_dim]
    (``w_r`` [d_model, heads, head_dim] = XLNet's ``rel_attn.r``)."""
    d = torch.arange(-max_distance, max_distance + 1)
    if clamp_len > 0:
        d = d.clamp(-clamp_len, clamp_len)
    return torch.einsum("km,mhd->khd", sinusoid(d, w_r.shape[0]), w_r.float())


@dataclass
class RelativeScoring:
    """One layer's relative-attention constants (float32): biases [heads, head_dim] and the
    key table of :func:`relative_key_table`, centred at ``max_distance``."""

    r_w_bias: torch.Tensor
    r_r_bias: torch.Tensor
    key_table: torch.Tensor
    max_distance: int
    scale: float


class SlotPositions:
    """Slot -> true position of the key written there (shared by all layers: they use the
    same slots). Grown on demand; stale entries are overwritten when a slot is reused."""

    def __init__(self) -> None:
        self.table = torch.zeros(0, dtype=torch.int64)

    def write(self, slots: torch.Tensor, positions: torch.Tensor) -> None:
        slots, positions = slots.to(torch.int64), positions.to(torch.int64)
        keep = slots >= 0
        slots, positions = slots[keep], positions[keep]
        if slots.numel() == 0:
            return
        need = int(slots.max()) + 1
        if need > self.table.numel():
            grown = torch.zeros(max(need, 2 * self.table.numel()), dtype=torch.int64,
                                device=slots.device)
            grown[: self.table.numel()] = self.table
            self.table = grown
        self.table[slots] = positions

    def read(self, slots: torch.Tensor) -> torch.Tensor:
        return self.table[slots]


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor) -> None:
    """Store k, v [T, kv_heads, head_dim] at token ``slots`` [T] (-1: padding, skipped)."""
    if kv_cache is None or kv_cache.numel() == 0:
        return
    block_size, head_dim = kv_cache.shape[2], k.shape[-1]
    slots = slots[: k.shape[0]].to(torch.int64)
    keep = slots >= 0
    slots, k, v = slots[keep], k[keep], v[keep]
    blocks, offsets = slots // block_size, slots % block_size
    kv_cache[blocks, :, offsets, :head_dim] = k.to(kv_cache.dtype)
    kv_cache[blocks, :, offsets, head_dim:] = v.to(kv_cache.dtype)


def _groups(metadata):
    """(block-table row, first row, rows, seq_len, causal) per group of ``metadata``."""
    qsl = metadata.query_start_loc.cpu().to(torch.int64).tolist()
    seq_lens = metadata.seq_lens.cpu().to(torch.int64).tolist()
    flags = getattr(metadata, "dynamic_causal", None)
    flags = flags.cpu().tolist() if flags is not None else [metadata.causal] * len(seq_lens)
    for i, s in enumerate(seq_lens[: len(qsl) - 1]):
        rows = qsl[i + 1] - qsl[i]
        if rows > 0 and s > 0:
            yield i, qsl[i], rows, s, bool(flags[i])


def paged_relative_attention(q: torch.Tensor, query_positions: torch.Tensor,
                             kv_cache: torch.Tensor, metadata, keys: SlotPositions,
                             rel: RelativeScoring) -> torch.Tensor:
    """XLNet attention of rows ``q`` [R, heads, head_dim] at ``query_positions`` [R] over the
    paged cache -> [R, heads, head_dim] (rows outside every group, and every row when
    ``metadata`` is None (profiling), are zeros)."""
    out = torch.zeros_like(q)
    if metadata is None or kv_cache is None or kv_cache.numel() == 0:
        return out
    block_size, head_dim = kv_cache.shape[2], q.shape[-1]
    block_table = metadata.block_table
    span = 2 * rel.max_distance
    for group, first, rows, seq_len, causal in _groups(metadata):
        j = torch.arange(seq_len, device=block_table.device)
        slots = block_table[group, j // block_size].to(torch.int64) * block_size \
            + j % block_size
        kv = kv_cache[slots // block_size, :, slots % block_size].float()  # [S, H, 2D]
        k, v = kv[..., :head_dim], kv[..., head_dim:]
        qi = q[first: first + rows].float()
        content = torch.einsum("rhd,shd->hrs", qi + rel.r_w_bias, k)
        dist = query_positions[first: first + rows, None] - keys.read(slots)[None, :]
        index = (dist + rel.max_distance).clamp(0, span)
        # scores of the distances this group uses only (not all 2 * max_distance + 1)
        low, high = int(index.min()), int(index.max())
        by_distance = torch.einsum("rhd,khd->hrk", qi + rel.r_r_bias,
                                   rel.key_table[low: high + 1])
        position = by_distance.gather(2, (index - low)[None].expand(by_distance.shape[0], -1, -1))
        score = (content + position) * rel.scale  # [H, r, S]
        if causal:  # row r sees keys [0, seq_len - rows + r]
            last = seq_len - rows + torch.arange(rows, device=score.device)
            score = score.masked_fill(j[None, None, :] > last[None, :, None], float("-inf"))
        prob = torch.softmax(score, dim=-1)
        out[first: first + rows] = torch.einsum("hrs,shd->rhd", prob, v).to(out.dtype)
    return out

