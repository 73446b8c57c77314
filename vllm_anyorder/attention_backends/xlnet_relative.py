"""XLNet's relative-position two-stream attention over vLLM's paged KV cache (any device).

XLNet (Yang et al., 2019), the model family of Guo & Ermon's AS-ARM checkpoints (App. D),
has no absolute positions in its token stream: query row i (position a_i) scores key j
(position b_j) as

    s_ij = scale * [ (q_i + r_w_bias) . k_j  +  (q_i + r_r_bias) . R(a_i - b_j) ]

with R(d) = [sin(d w), cos(d w)] @ W_r per head (``attn_type="bi"``, distances clamped to
``clamp_len`` when it is > 0). XLNet's segment term is left out: an AS-ARM request is one
segment, where that term is the same for every key of a row and cancels in the softmax.
The second term needs the *key's position*, which no vLLM attention op sees, so the model
runs the plugin's PyTorch attention (``paged_torch.paged_attention``) with the second term
as an additive score (:func:`paged_relative_attention`):

* **Cache and masks**: those of ``asarm_torch.AsArmTorchBackend`` (vLLM allocates the cache;
  the AS-ARM builder's row groups: the prompt attends to the whole prompt, generated rows
  causally; query rows: the forward's query plan, or the proposer's prefix metadata). A
  per-model slot -> position table (:class:`SlotPositions`) records each key's true
  position when it is written (the sequence index, or an infill request's table entry).
* **Two streams.** Content rows write K/V and read; query rows (``mask_emb``, positioned at
  the token they predict) only read: XLNet's query stream attends to the content of the
  tokens decoded before its target.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_anyorder.attention_backends.paged_torch import paged_attention, prepared_for


def sinusoid(distances: torch.Tensor, d_model: int) -> torch.Tensor:
    """XLNet's relative encoding of ``distances`` [N] -> [N, d_model] = [sin(d w), cos(d w)],
    w_f = 10000^(-2f / d_model) (``XLNetModel.relative_positional_encoding``)."""
    steps = torch.arange(0, d_model, 2.0, device=distances.device)
    inv_freq = 1.0 / torch.pow(10000.0, steps / d_model)
    angle = distances.to(torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angle.sin(), angle.cos()], dim=-1)


def relative_key_table(w_r: torch.Tensor, max_distance: int, clamp_len: int = -1
                       ) -> torch.Tensor:
    """R(d) for d in [-max_distance, max_distance]: [2 * max_distance + 1, heads, head_dim]
    (``w_r`` [d_model, heads, head_dim] = XLNet's ``rel_attn.r``)."""
    d = torch.arange(-max_distance, max_distance + 1, device=w_r.device)
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
        self.table: torch.Tensor | None = None  # on the device of the first slots written

    def write(self, slots: torch.Tensor, positions: torch.Tensor) -> None:
        device = slots.device if self.table is None else self.table.device
        slots = slots.to(device=device, dtype=torch.int64)
        positions = positions[: slots.shape[0]].to(device=device, dtype=torch.int64)
        keep = slots >= 0
        slots, positions = slots[keep], positions[keep]
        if slots.numel() == 0:
            return
        have = 0 if self.table is None else self.table.numel()
        need = int(slots.max()) + 1
        if need > have:
            grown = torch.zeros(max(need, 2 * have), dtype=torch.int64, device=device)
            if self.table is not None:
                grown[:have] = self.table
            self.table = grown
        self.table[slots] = positions

    def read(self, slots: torch.Tensor) -> torch.Tensor:
        return self.table[slots.to(self.table.device)]


def paged_relative_attention(q: torch.Tensor, query_positions: torch.Tensor,
                             kv_cache: torch.Tensor, metadata, keys: SlotPositions,
                             rel: RelativeScoring) -> torch.Tensor:
    """XLNet attention of rows ``q`` [R, heads, head_dim] at ``query_positions`` [R] over the
    paged cache, row groups of ``metadata`` (``TorchPagedMetadata``) -> [R, heads, head_dim]
    (rows outside every group, and every row when ``metadata`` is None (profiling), are
    zeros). The content term is ``paged_attention``'s q . k with q + r_w_bias; the position
    term its additive score."""
    if metadata is None or kv_cache is None or kv_cache.numel() == 0:
        return torch.zeros_like(q)
    qf, span = q.float(), 2 * rel.max_distance

    def position_scores(group, key_slots: torch.Tensor) -> torch.Tensor:  # [H, R, S]
        rows = slice(group.first, group.first + group.rows)
        dist = query_positions[rows, None] - keys.read(key_slots)[None, :]
        index = (dist + rel.max_distance).clamp(0, span)
        # scores of the distances this group uses only (not all 2 * max_distance + 1)
        low, high = int(index.min()), int(index.max())
        by_distance = torch.einsum("rhd,khd->hrk", qf[rows] + rel.r_r_bias,
                                   rel.key_table[low: high + 1])
        index = (index - low)[None].expand(by_distance.shape[0], -1, -1)
        return by_distance.gather(2, index) * rel.scale

    out = paged_attention(qf + rel.r_w_bias, kv_cache, metadata.block_table, metadata.groups,
                          rel.scale, score_bias=position_scores,
                          prepared=prepared_for(metadata, kv_cache))
    return out.to(q.dtype)
