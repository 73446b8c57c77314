"""LLaDA (GSAI-ML/LLaDA-8B-Base, LLaDA-8B-Instruct) in plain PyTorch, loading the released format.

LLaDA is a Llama-shaped transformer run as an *encoder*: attention is bidirectional (the
released ``modeling_llada.py`` calls SDPA with ``is_causal=False`` and a zero bias), RMSNorm,
rotary embeddings (rotate-half) on q and k, SwiGLU MLP. There is no logit shift: the logits at
row i predict the token at position i. The mask token is ``mask_token_id`` (126336).

Format as released (OLMo-derived names; details and sources in the dLLM notes):

* ``config.json``: ``model_type "llada"``, ``architectures ["LLaDAModelLM"]``, ``d_model``,
  ``n_heads``, ``n_kv_heads``, ``n_layers``, ``mlp_hidden_size``, ``vocab_size``,
  ``embedding_size`` (rows of the embedding / LM head, >= vocab_size), ``rope_theta``,
  ``rms_norm_eps``, ``mask_token_id``, ``eos_token_id``, ``weight_tying``, ``include_bias``,
  ``include_qkv_bias``, ``block_type "llama"``, ``layer_norm_type "rms"``, ... (46 keys).
* weights under ``model.transformer.``: ``wte.weight`` [E, d];
  ``blocks.N.{attn_norm, ff_norm}.weight`` [d]; ``blocks.N.{q,k,v}_proj.weight``;
  ``blocks.N.attn_out.weight`` [d, d]; ``blocks.N.ff_proj.weight`` (gate) and
  ``blocks.N.up_proj.weight`` [I, d]; ``blocks.N.ff_out.weight`` [d, I]; ``ln_f.weight`` [d];
  ``ff_out.weight`` [E, d] (the LM head; absent when ``weight_tying``). No rotary buffers.
  Released as ``model-0000k-of-00006.safetensors`` + ``model.safetensors.index.json``.

The model interface shared with ``dream.DreamModel`` (what the dLLM core's evaluator uses)::

    forward(tokens [B, L] long, positions [B, L] long, past_kv=None, attn_mask=None,
            shift=True) -> (logits [B, L, V] float32, new_kv)

``past_kv`` is a per-layer tuple of ``(k, v)`` with shape [B, P, kv_heads, head_dim] (keys
already rotated at their positions), ``attn_mask`` a bool [B, L, P + L] (True = may attend;
None = every row sees every key: full bidirectional attention), ``new_kv`` the same structure
for the L new rows only. Rows that may attend to nothing (padding) give zeros. ``shift`` only
matters for models with ``logit_shift = 1`` (Dream). ``mask_token_id``, ``eos_token_id`` and
``logit_shift`` are attributes.

The shared building blocks (RMSNorm, rotary, masked attention, safetensors I/O, and
``ReleasedDllm``: the token ids, the ``model`` container and checkpoint I/O of the model
class) live here and ``dream.py`` reuses them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from .released_config import ReleasedConfig, write_config

MODEL_TYPE = "llada"
ARCHITECTURE = "LLaDAModelLM"
PREFIX = "model.transformer."

# config.json keys the release carries that this class does not model; written back as
# released (values of LLaDA-8B-Instruct) unless a loaded checkpoint says otherwise.
RELEASED_FIXED_KEYS = {
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0,
    "attention_dropout": 0.0, "attention_layer_norm": False,
    "attention_layer_norm_with_affine": True,
    "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                 "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
                 "AutoModel": "modeling_llada.LLaDAModelLM"},
    "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama",
    "embedding_dropout": 0.0, "flash_attention": False, "include_bias": False,
    "init_cutoff_factor": None, "init_device": "meta", "init_fn": "mitchell", "init_std": 0.02,
    "layer_norm_type": "rms", "layer_norm_with_affine": True, "multi_query_attention": None,
    "precision": "amp_bf16", "residual_dropout": 0.0, "rope": True, "rope_full_precision": True,
    "use_cache": False,
}
# values of those keys this implementation can run (anything else is refused on load)
_REQUIRED = {"activation_type": "silu", "alibi": False, "attention_layer_norm": False,
             "block_type": "llama", "include_bias": False, "layer_norm_type": "rms",
             "layer_norm_with_affine": True, "rope": True, "block_group_size": 1}


# ----------------------------------------------------------------------------- building blocks
def rms_norm(x, weight, eps: float):
    """RMSNorm computed in fp32, cast back, then scaled (LLaDA and Qwen2 agree on this order)."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate(x, positions, theta: float):
    """Rotate-half rotary at explicit positions. x [B, L, H, D], positions [B, L]."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = positions.float()[..., None] * inv_freq  # [B, L, D/2]
    ang = torch.cat([ang, ang], -1)[:, :, None]  # [B, L, 1, D]
    xf = x.float()
    rot = torch.cat([-xf[..., d // 2:], xf[..., : d // 2]], -1)
    return (xf * ang.cos() + rot * ang.sin()).to(x.dtype)


def attend(q, k, v, past, attn_mask):
    """Masked softmax attention. q [B,L,H,D]; k, v [B,L,KV,D]; past (k, v) [B,P,KV,D] or None;
    attn_mask [B, L, P+L] bool or None. Returns [B, L, H*D]; rows with no key give zeros."""
    if past is not None:
        k, v = torch.cat([past[0], k], 1), torch.cat([past[1], v], 1)
    rep = q.shape[2] // k.shape[2]  # grouped-query attention: heads share a K/V head
    k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
    scores = torch.einsum("blhd,bkhd->bhlk", q.float(), k.float()) * q.shape[-1] ** -0.5
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask[:, None], float("-inf"))
    probs = torch.softmax(scores, -1).nan_to_num(0.0)
    out = torch.einsum("bhlk,bkhd->blhd", probs, v.float()).to(q.dtype)
    return out.reshape(*out.shape[:2], -1)


def save_safetensors(state: dict, path: Path, max_shard_bytes: int | None) -> None:
    """One ``model.safetensors``, or HF shards ``model-0000k-of-0000n.safetensors`` plus
    ``model.safetensors.index.json`` (tensors filled in state-dict order)."""
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous() for k, v in state.items()}
    if max_shard_bytes is None:
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
        return
    shards, size = [{}], 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def load_safetensors(path: Path) -> dict:
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if not index.exists():
        return load_file(str(path / "model.safetensors"))
    state = {}
    for fname in sorted(set(json.loads(index.read_text())["weight_map"].values())):
        state.update(load_file(str(path / fname)))
    return state


def randomize_(model: nn.Module, seed: int, std: float) -> None:
    """N(0, std) weights and biases, unit norm weights: peaked, context-dependent logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("ln_f.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)


class ReleasedDllm(nn.Module):
    """What ``LLaDAModel`` and ``DreamModel`` share: the config and its token ids, the
    ``model`` container under which the released tensor names live, and checkpoint I/O in the
    released layout (``config.json`` + one ``model.safetensors`` or HF shards)."""

    CONFIG: ClassVar[type[ReleasedConfig]]  # the format's config class
    logit_shift: ClassVar[int]

    def __init__(self, config: ReleasedConfig) -> None:
        super().__init__()
        self.config = config
        self.mask_token_id, self.eos_token_id = config.mask_token_id, config.eos_token_id
        self.model = nn.Module()
        self.build(config)

    def build(self, c) -> None:
        """Create the format's modules (under ``self.model`` and beside it)."""
        raise NotImplementedError

    def tied_head(self) -> tuple[str, str] | None:
        """(LM head, embedding) state-dict names when the head is the embedding's tensor and
        the checkpoint stores it once; None when there is no such head."""
        return None

    def config_json(self) -> dict:
        """The ``config.json`` written by ``save_pretrained``."""
        return self.config.to_json()

    @classmethod
    def from_pretrained(cls, path, dtype: torch.dtype | None = None):
        path = Path(path)
        model = cls(cls.CONFIG.read(path))
        state = load_safetensors(path)
        tied = model.tied_head()
        if tied:
            state.setdefault(tied[0], state[tied[1]])
        model.load_state_dict(state, strict=True)
        return (model.to(dtype) if dtype is not None else model).eval()

    def save_pretrained(self, path, max_shard_bytes: int | None = None) -> Path:
        path = write_config(path, self.config_json())
        state = dict(self.state_dict())
        tied = self.tied_head()
        if tied:
            state.pop(tied[0])
        save_safetensors(state, path, max_shard_bytes)
        return path


# ----------------------------------------------------------------------------- config
@dataclass(frozen=True)
class LLaDAConfig(ReleasedConfig):
    d_model: int = 4096
    n_heads: int = 32
    n_kv_heads: int | None = 32
    n_layers: int = 32
    mlp_hidden_size: int | None = 12288
    mlp_ratio: int = 4
    vocab_size: int = 126464
    embedding_size: int | None = 126464
    max_sequence_length: int = 4096
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    mask_token_id: int = 126336
    eos_token_id: int = 126081
    pad_token_id: int = 126081
    weight_tying: bool = False
    include_qkv_bias: bool = False
    scale_logits: bool = False
    input_emb_norm: bool = False
    extra: dict = field(default_factory=dict)  # other config.json keys, written back on save
    MODEL_TYPE, ARCHITECTURE, FORMAT = MODEL_TYPE, ARCHITECTURE, "LLaDA"
    FIXED_KEYS, REQUIRED = RELEASED_FIXED_KEYS, _REQUIRED

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def hidden(self) -> int:
        return self.mlp_hidden_size or self.mlp_ratio * self.d_model

    @property
    def rows(self) -> int:
        """Rows of the embedding and of the LM head (the logit width)."""
        return self.embedding_size or self.vocab_size

    @classmethod
    def check_json(cls, d: dict) -> None:
        if d["d_model"] % d["n_heads"]:
            raise ValueError("d_model must be a multiple of n_heads")


# ----------------------------------------------------------------------------- model
class LLaDABlock(nn.Module):
    def __init__(self, c: LLaDAConfig) -> None:
        super().__init__()
        d, kv = c.d_model, c.kv_heads * c.head_dim
        self.attn_norm = nn.Module()
        self.attn_norm.weight = nn.Parameter(torch.ones(d))
        self.ff_norm = nn.Module()
        self.ff_norm.weight = nn.Parameter(torch.ones(d))
        self.q_proj = nn.Linear(d, d, bias=c.include_qkv_bias)
        self.k_proj = nn.Linear(d, kv, bias=c.include_qkv_bias)
        self.v_proj = nn.Linear(d, kv, bias=c.include_qkv_bias)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.ff_proj = nn.Linear(d, c.hidden, bias=False)  # gate (goes through silu)
        self.up_proj = nn.Linear(d, c.hidden, bias=False)
        self.ff_out = nn.Linear(c.hidden, d, bias=False)


class LLaDAModel(ReleasedDllm):
    """Bidirectional LLaDA with the shared dLLM model interface (see the module docstring)."""

    CONFIG = LLaDAConfig
    logit_shift = 0

    def build(self, c: LLaDAConfig) -> None:
        self.model.transformer = t = nn.Module()
        t.wte = nn.Embedding(c.rows, c.d_model)
        t.blocks = nn.ModuleList(LLaDABlock(c) for _ in range(c.n_layers))
        t.ln_f = nn.Module()
        t.ln_f.weight = nn.Parameter(torch.ones(c.d_model))
        if not c.weight_tying:
            t.ff_out = nn.Linear(c.d_model, c.rows, bias=False)

    @torch.no_grad()
    def forward(self, tokens, positions, past_kv=None, attn_mask=None, shift=True):
        c, t = self.config, self.model.transformer
        b, n = tokens.shape
        x = t.wte(tokens)
        if c.input_emb_norm:
            x = x * c.d_model ** 0.5
        new_kv = []
        for i, blk in enumerate(t.blocks):
            h = rms_norm(x, blk.attn_norm.weight, c.rms_norm_eps)
            q = rotate(blk.q_proj(h).view(b, n, c.n_heads, c.head_dim), positions, c.rope_theta)
            k = rotate(blk.k_proj(h).view(b, n, c.kv_heads, c.head_dim), positions, c.rope_theta)
            v = blk.v_proj(h).view(b, n, c.kv_heads, c.head_dim)
            new_kv.append((k, v))
            x = x + blk.attn_out(attend(q, k, v, past_kv[i] if past_kv else None, attn_mask))
            h = rms_norm(x, blk.ff_norm.weight, c.rms_norm_eps)
            x = x + blk.ff_out(nn.functional.silu(blk.ff_proj(h)) * blk.up_proj(h))
        x = rms_norm(x, t.ln_f.weight, c.rms_norm_eps)
        head = t.wte.weight if c.weight_tying else t.ff_out.weight
        logits = nn.functional.linear(x, head).float()
        if c.scale_logits:
            logits = logits / c.d_model ** 0.5
        return logits, tuple(new_kv)


def random_llada(config: LLaDAConfig, seed: int = 0, std: float = 0.3) -> LLaDAModel:
    """Random fp32 LLaDA; ``std`` ~0.3 gives peaked logits (argmax margins far above rounding)."""
    model = LLaDAModel(config)
    randomize_(model, seed, std)
    return model.eval()

