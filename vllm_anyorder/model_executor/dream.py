"""Dream (Dream-org/Dream-v0-Instruct-7B, Dream-v0-Base-7B) in plain PyTorch, released format.

Dream is a Qwen2 decoder run with bidirectional attention (``is_causal=False``): RMSNorm
(eps 1e-6), rotate-half rotary with theta 1e6, GQA, biases on q/k/v only, SwiGLU MLP, an
untied ``lm_head``. It was adapted from an autoregressive model and keeps its *logit shift*:
the token at position i is read from the logits of row i-1, and position 0 reuses its own
logits (every consumer applies ``cat([logits[:, :1], logits[:, :-1]], 1)``; the released
``forward`` does not). Here ``forward(..., shift=True)`` applies it, so the returned row i
predicts token i; ``logit_shift = 1`` tells a caller that continues from a KV prefix that row
0 of a chunk really needs the raw logits of the previous (cached) row.

Format as released: flat Qwen2-like ``config.json`` (``model_type "Dream"``, ``architectures
["DreamModel"]``, ``mask_token_id`` 151666, ``tie_word_embeddings false``, no ``head_dim``:
head_dim = hidden_size // num_attention_heads); weights ``model.embed_tokens.weight``,
``model.layers.N.self_attn.{q,k,v}_proj.{weight,bias}``, ``...o_proj.weight``,
``model.layers.N.mlp.{gate,up,down}_proj.weight``, ``model.layers.N.{input,post_attention}_
layernorm.weight``, ``model.norm.weight``, ``lm_head.weight``; no rotary buffers. Released as
4 bf16 shards plus ``model.safetensors.index.json``.

Same model interface as ``llada.LLaDAModel`` (see that module's docstring).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .llada import ReleasedDllm, attend, randomize_, rms_norm, rotate
from .released_config import ReleasedConfig

MODEL_TYPE = "Dream"
ARCHITECTURE = "DreamModel"

RELEASED_FIXED_KEYS = {
    "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_dream.DreamConfig",
                 "AutoModel": "modeling_dream.DreamModel"},
    "hidden_act": "silu", "initializer_range": 0.02, "max_window_layers": 28,
    "rope_scaling": None, "sliding_window": None, "torch_dtype": "bfloat16",
    "transformers_version": "4.46.2", "use_cache": True, "use_mrope": False,
    "use_sliding_window": False,
}
_REQUIRED = {"hidden_act": "silu", "rope_scaling": None, "use_sliding_window": False,
             "use_mrope": False}


@dataclass(frozen=True)
class DreamConfig(ReleasedConfig):
    vocab_size: int = 152064
    hidden_size: int = 3584
    intermediate_size: int = 18944
    num_hidden_layers: int = 28
    num_attention_heads: int = 28
    num_key_value_heads: int = 4
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    tie_word_embeddings: bool = False
    mask_token_id: int = 151666
    bos_token_id: int = 151643
    eos_token_id: int = 151643
    pad_token_id: int = 151643
    extra: dict = field(default_factory=dict)  # other config.json keys, written back on save
    MODEL_TYPE, ARCHITECTURE, FORMAT = MODEL_TYPE, ARCHITECTURE, "Dream"
    FIXED_KEYS, REQUIRED = RELEASED_FIXED_KEYS, _REQUIRED

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def fill_defaults(cls, own: dict, d: dict) -> dict:
        return {"num_key_value_heads": d["num_attention_heads"], **own}


class _Norm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class DreamLayer(nn.Module):
    def __init__(self, c: DreamConfig) -> None:
        super().__init__()
        h, q, kv = c.hidden_size, c.num_attention_heads * c.head_dim, \
            c.num_key_value_heads * c.head_dim
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(h, q, bias=True)
        self.self_attn.k_proj = nn.Linear(h, kv, bias=True)
        self.self_attn.v_proj = nn.Linear(h, kv, bias=True)
        self.self_attn.o_proj = nn.Linear(q, h, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(c.intermediate_size, h, bias=False)
        self.input_layernorm = _Norm(h)
        self.post_attention_layernorm = _Norm(h)


class DreamModel(ReleasedDllm):
    """Bidirectional Dream with the shared dLLM model interface."""

    CONFIG = DreamConfig
    logit_shift = 1

    def build(self, c: DreamConfig) -> None:
        self.model.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.model.layers = nn.ModuleList(DreamLayer(c) for _ in range(c.num_hidden_layers))
        self.model.norm = _Norm(c.hidden_size)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.no_grad()
    def forward(self, tokens, positions, past_kv=None, attn_mask=None, shift=True):
        c = self.config
        b, n = tokens.shape
        nh, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        x = self.model.embed_tokens(tokens)
        new_kv = []
        for i, layer in enumerate(self.model.layers):
            a = layer.self_attn
            h = rms_norm(x, layer.input_layernorm.weight, c.rms_norm_eps)
            q = rotate(a.q_proj(h).view(b, n, nh, hd), positions, c.rope_theta)
            k = rotate(a.k_proj(h).view(b, n, nkv, hd), positions, c.rope_theta)
            v = a.v_proj(h).view(b, n, nkv, hd)
            new_kv.append((k, v))
            x = x + a.o_proj(attend(q, k, v, past_kv[i] if past_kv else None, attn_mask))
            h = rms_norm(x, layer.post_attention_layernorm.weight, c.rms_norm_eps)
            m = layer.mlp
            x = x + m.down_proj(nn.functional.silu(m.gate_proj(h)) * m.up_proj(h))
        logits = self.lm_head(rms_norm(x, self.model.norm.weight, c.rms_norm_eps)).float()
        if shift:  # row i predicts token i: read it from row i-1 (row 0 keeps its own)
            logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)
        return logits, tuple(new_kv)

    # ------------------------------------------------------------------ checkpoint
    def tied_head(self) -> tuple[str, str] | None:
        if self.config.tie_word_embeddings:
            return "lm_head.weight", "model.embed_tokens.weight"
        return None

    def config_json(self) -> dict:
        return {**self.config.to_json(),
                "torch_dtype": str(self.lm_head.weight.dtype).removeprefix("torch.")}


def random_dream(config: DreamConfig, seed: int = 0, std: float = 0.3) -> DreamModel:
    """Random fp32 Dream; ``std`` ~0.3 gives peaked logits (argmax margins far above rounding)."""
    model = DreamModel(config)
    randomize_(model, seed, std)
    return model.eval()

