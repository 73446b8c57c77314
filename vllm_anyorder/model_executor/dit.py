"""The diffusion transformer (DiT) shared by the released MDLM and SEDD checkpoints, in plain torch.

Architecture of MDLM (Sahoo et al. 2024, "Simple and Effective Masked Diffusion Language
Models", ``kuleshov-group/mdlm-owt``) and SEDD (Lou et al. 2024, "Discrete Diffusion Modeling
by Estimating the Ratios of the Data Distribution", ``louaaron/sedd-*``); both are the DiT of
Peebles & Xie with adaLN conditioning on the noise level. The module and parameter names
below are exactly the released tensor names (without MDLM's ``backbone.`` prefix), see
``shared/notes/released-formats.md`` sections 2-3:

    vocab_embed.embedding            raw Parameter [V, H] (no ".weight")
    sigma_map.mlp.{0,2}              256 sinusoidal features -> Linear -> SiLU -> Linear (cond C)
    rotary_emb.inv_freq              persistent buffer [hd/2] = 1/10000**(arange(0,hd,2)/hd)
    blocks.N.norm1/norm2             weight-only LayerNorm, eps 1e-5, computed in fp32
    blocks.N.attn_qkv / attn_out     bias-free; qkv rows [q | k | v], each "(heads head_dim)"
    blocks.N.mlp.{0,2}               Linear H->4H, GELU (tanh), Linear 4H->H
    blocks.N.adaLN_modulation        Linear C -> 6H: shift/scale/gate for attention and MLP
    output_layer.{norm_final, linear, adaLN_modulation}   final modulated norm and V logits

Numerics: the residual stream, norms and modulation run in fp32 while the linear layers run
in the weights' dtype; this is what upstream gets from fp32 weights under bf16 autocast, and it
keeps bf16 checkpoints accurate. ``inv_freq`` stays fp32 whatever the module is cast to.
Attention runs in the weights' dtype even under autocast (bf16 SDPA backward is slow on CPU).
Attention is bidirectional (``F.scaled_dot_product_attention``, scale 1/sqrt(head_dim)) with
rotate-half rotary embeddings on q and k at positions 0..L-1; padding keys can be excluded.

:class:`MaskedDiffusionLM` adds each family's output convention: MDLM zeroes sigma without
``time_conditioning`` and returns logits; SEDD returns the log-score (``scale_by_sigma`` shift,
0 scattered at each input token); ``token_logits`` turns either into drafting scores.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

FREQ_FEATURES = 256  # sinusoidal features of the noise level (TimestepEmbedder in both repos)


class LayerNorm(nn.Module):
    """Weight-only LayerNorm computed in fp32 (autocast off), as in both repos."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return F.layer_norm(x.float(), (x.shape[-1],), self.weight.float(), None, 1e-5)


class Rotary(nn.Module):
    """Rotate-half rotary embedding, base 10000, from the persistent ``inv_freq`` buffer."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        inv_freq = 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)
        self.register_buffer("inv_freq", inv_freq)  # persistent: it is in the released files
        self._cache: tuple | None = None

    def _apply(self, fn, recurse=True):
        kept = self.inv_freq
        super()._apply(fn, recurse)
        # keep the file's fp32 values on a dtype cast (bf16 angles drift by ~0.25 rad at 128)
        self.inv_freq = kept.to(device=self.inv_freq.device, dtype=torch.float32)
        self._cache = None
        return self

    def cos_sin(self, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [L, head_dim] for positions 0..L-1 (cached per length/dtype)."""
        key = (length, dtype, self.inv_freq.device)
        if self._cache is None or self._cache[0] != key:
            pos = torch.arange(length, device=self.inv_freq.device, dtype=torch.float32)
            freqs = torch.outer(pos, self.inv_freq.float())
            emb = torch.cat([freqs, freqs], dim=-1)
            self._cache = (key, emb.cos().to(dtype), emb.sin().to(dtype))
        return self._cache[1], self._cache[2]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class TimestepEmbedder(nn.Module):
    """Noise level sigma [B] -> [B, C]: [cos, sin] of sigma * exp(-ln(1e4) k / 128), then an MLP."""

    def __init__(self, cond_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(FREQ_FEATURES, cond_dim), nn.SiLU(),
                                 nn.Linear(cond_dim, cond_dim))

    def forward(self, sigma: torch.Tensor) -> torch.Tensor:
        half = FREQ_FEATURES // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=sigma.device) / half)
        args = sigma.float()[:, None] * freqs[None]
        feats = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        return self.mlp(feats.to(self.mlp[0].weight.dtype)).float()


def _linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """Linear in the layer's dtype, fp32 result (the residual stream is fp32)."""
    return layer(x.to(layer.weight.dtype)).float()


def _modulate(x, shift, scale):
    return x * (1 + scale) + shift


class DDiTBlock(nn.Module):
    """adaLN DiT block: x += gate_msa * attn(mod(norm1 x)); x += gate_mlp * mlp(mod(norm2 x))."""

    def __init__(self, hidden: int, n_heads: int, cond_dim: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = LayerNorm(hidden)
        self.attn_qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.attn_out = nn.Linear(hidden, hidden, bias=False)
        self.norm2 = LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * hidden, hidden))
        self.adaLN_modulation = nn.Linear(cond_dim, 6 * hidden)

    def forward(self, x, c, cos, sin, attn_mask):
        b, length, hidden = x.shape
        mods = _linear(self.adaLN_modulation, c)[:, None].chunk(6, dim=2)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mods
        h = _modulate(self.norm1(x), shift_msa, scale_msa).to(self.attn_qkv.weight.dtype)
        qkv = self.attn_qkv(h).view(b, length, 3, self.n_heads, hidden // self.n_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, heads, L, head_dim]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        with torch.autocast(x.device.type, enabled=False):  # in the weights' dtype
            att = F.scaled_dot_product_attention(q, k, v.to(q.dtype), attn_mask=attn_mask)
        x = x + gate_msa * _linear(self.attn_out, att.transpose(1, 2).reshape(b, length, hidden))
        h = _modulate(self.norm2(x), shift_mlp, scale_mlp)
        return x + gate_mlp * _linear(self.mlp[2], self.mlp[1](self.mlp[0](h.to(self.mlp[0].weight.dtype))))


class DDitFinalLayer(nn.Module):
    def __init__(self, hidden: int, vocab: int, cond_dim: int) -> None:
        super().__init__()
        self.norm_final = LayerNorm(hidden)
        self.linear = nn.Linear(hidden, vocab)
        self.adaLN_modulation = nn.Linear(cond_dim, 2 * hidden)

    def forward(self, x, c):
        shift, scale = _linear(self.adaLN_modulation, c)[:, None].chunk(2, dim=2)
        return _linear(self.linear, _modulate(self.norm_final(x), shift, scale))


class EmbeddingLayer(nn.Module):
    """Token embedding as a raw Parameter named ``embedding`` (no ``.weight``, as released)."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.embedding = nn.Parameter(torch.empty(vocab, hidden))
        nn.init.kaiming_uniform_(self.embedding, a=math.sqrt(5))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding[ids].float()


class DiT(nn.Module):
    """Bidirectional DiT: (ids [B, L], sigma [B], key_mask [B, L] | None) -> [B, L, V] fp32.

    ``positions`` (bool [B, L]) runs the output layer only there and returns [N, V] in
    row-major order: the trunk sees every position, the vocabulary projection (the largest
    matmul at small sizes) only the N positions that are read (masked ones, for drafting
    and for the masked cross-entropy)."""

    def __init__(self, vocab: int, hidden: int, cond_dim: int, n_blocks: int, n_heads: int):
        super().__init__()
        self.vocab_embed = EmbeddingLayer(vocab, hidden)
        self.sigma_map = TimestepEmbedder(cond_dim)
        self.rotary_emb = Rotary(hidden // n_heads)
        self.blocks = nn.ModuleList(DDiTBlock(hidden, n_heads, cond_dim) for _ in range(n_blocks))
        self.output_layer = DDitFinalLayer(hidden, vocab, cond_dim)

    def forward(self, ids, sigma, key_mask=None, positions=None):
        x = self.vocab_embed(ids)
        c = F.silu(self.sigma_map(sigma))
        dtype = self.output_layer.linear.weight.dtype
        cos, sin = self.rotary_emb.cos_sin(ids.shape[1], dtype)
        attn_mask = None
        if key_mask is not None and not bool(key_mask.all()):
            attn_mask = key_mask[:, None, None, :].to(torch.bool)  # True = may attend
        for block in self.blocks:
            x = block(x, c, cos, sin, attn_mask)
        if positions is None:
            return self.output_layer(x, c)
        rows = positions.nonzero()[:, 0]
        return self.output_layer(x[positions][:, None], c[rows])[:, 0]


NOISE_EPS = 1e-3  # loglinear noise eps of MDLM and SEDD


def loglinear_sigma(t: torch.Tensor) -> torch.Tensor:
    """Total noise of the loglinear schedule: sigma(t) = -log1p(-(1 - 1e-3) t)."""
    return -torch.log1p(-(1 - NOISE_EPS) * t.float())


class MaskedDiffusionLM(torch.nn.Module):
    """An MDLM or SEDD-absorb network (:class:`DiT`) plus its family's output convention
    (formats and loading: :mod:`.masked_diffusion`; ``spec`` is its ``MaskedDiffusionSpec``)."""

    def __init__(self, spec) -> None:
        super().__init__()
        self.spec = spec
        self.dit = DiT(spec.vocab_size, spec.hidden_size, spec.cond_dim, spec.n_blocks, spec.n_heads)

    def forward(self, input_ids, sigma, key_mask=None, positions=None):
        """Raw output [B, L, vocab_size] fp32 (MDLM: logits; SEDD: log-score); with
        ``positions`` (bool [B, L]) only those rows, as [N, vocab_size] (see :class:`DiT`)."""
        if not self.spec.time_conditioning:
            sigma = torch.zeros_like(sigma)  # MDLM with time_conditioning false
        x = self.dit(input_ids, sigma, key_mask, positions)
        if self.spec.family == "sedd":
            ids = input_ids if positions is None else input_ids[positions]
            if self.spec.scale_by_sigma:
                s = sigma.float()
                shift = torch.where(s < 0.5, torch.expm1(s), s.exp() - 1).log()
                shift = shift[:, None] if positions is None else shift[positions.nonzero()[:, 0]]
                x = x - shift[..., None] - math.log(x.shape[-1] - 1)
            x = torch.scatter(x, -1, ids[..., None], torch.zeros_like(x[..., :1]))
        return x

    def token_logits(self, input_ids, t, key_mask=None):
        """fp32 [B, L, num_tokens] scores for denoising step time ``t`` [B] in (0, 1].

        Masked positions: the model's scores over the real tokens (mask column dropped); their
        softmax is the drafter's distribution (SEDD: the scale_by_sigma shift is constant per
        row, and the input-token scatter hits the dropped mask column). Positions holding a
        real token get MDLM's SUBS carry-over, 0 at that token and -inf elsewhere (this also
        stands in for SEDD's scatter of 0 there, which is not a distribution); padding
        (``key_mask`` False) gets zeros. The output layer runs only at masked real positions."""
        n = self.spec.num_tokens
        masked = input_ids == self.spec.mask_token_id
        real = torch.ones_like(masked) if key_mask is None else key_mask.to(torch.bool)
        wanted = masked & real
        raw = self.forward(input_ids, loglinear_sigma(t), key_mask, positions=wanted)
        scores = torch.full((*input_ids.shape, n), float("-inf"), device=raw.device)
        clean = ~masked
        scores[clean.nonzero(as_tuple=True) + (input_ids[clean],)] = 0.0
        scores[(~real).nonzero(as_tuple=True)] = 0.0
        scores[wanted] = raw[:, :n]
        return scores
