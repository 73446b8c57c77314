"""Any-subset autoregressive model (AS-ARM) on Llama weights, in plain PyTorch.

Guo & Ermon, "Reviving Any-Subset Autoregressive Models ...", Sec. 4 and App. D: an AS-ARM
gives p(x_p | decoded set) for any position p, from two streams that share every weight
(XLNet's two-stream attention, here on a Llama decoder):

* content stream -- a Llama decoder over the decoded tokens (RMSNorm, rotary at the tokens'
  TRUE positions, GQA, SwiGLU) whose attention is causal in *generation order*: visible
  (prompt) tokens attend to each other fully; a generated token attends to the visible ones
  and to the tokens generated before it, itself included (Eq. 6 + Eq. 4).
* query stream -- one row per queried position p: it starts from a learned vector
  ``model.query_embed`` (the same for every p), and at every layer its attention query comes
  from the query row with rotary at p, its keys/values from the content stream of the tokens
  decoded *before* p (never p itself). The final row goes through the LM head.

Both streams run as one stack of rows through the same layers: rows [0, L) are content,
rows [L, L+Q) are queries whose keys/values are never read by anyone. That is the shape a
paged-KV engine wants: content rows write the cache, query rows only read it.

The model interface (shared with ``xlnet_asarm.XLNetAsArm``)::

    content_and_query(tokens [L] long, positions [L] long, order [L] long,
                      query_positions [Q] long) -> logits [Q, V] float32

``order[j]`` is token j's generation rank: 0 for every visible token, 1, 2, ... for generated
tokens in the order they were decoded (distinct). A query at position p predicts x_p given the
tokens of rank < rank(p), where rank(p) is the order of the token already at p (a drafted or
generated token being scored) or +inf when p holds no token (a fresh draft). Querying a
visible position is an error.

File format (Hugging Face layout): ``config.json`` with Llama keys plus
``model_type = "anyorder_llama"``, ``architectures = ["AnySubsetLlamaForCausalLM"]``,
``query_init = "learned"``; ``model.safetensors`` with Llama tensor names plus
``model.query_embed`` [hidden].
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

MODEL_TYPE = "anyorder_llama"
ARCHITECTURE = "AnySubsetLlamaForCausalLM"
QUERY_INITS = ("learned",)
INF_RANK = torch.iinfo(torch.long).max


@dataclass(frozen=True)
class AsArmConfig:
    vocab_size: int
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    head_dim: int | None = None  # None: hidden_size // num_attention_heads, as in Llama
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    query_init: str = "learned"  # how a query row starts: one of QUERY_INITS
    extra: dict = field(default_factory=dict)  # other config.json keys, kept on save

    def __post_init__(self) -> None:
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    def to_json(self) -> dict:
        d = asdict(self)
        extra = d.pop("extra")
        return {**extra, "model_type": MODEL_TYPE, "architectures": [ARCHITECTURE],
                "hidden_act": "silu", "torch_dtype": "float32", "attention_bias": False, **d}

    @classmethod
    def from_json(cls, d: dict) -> "AsArmConfig":
        if d.get("model_type") != MODEL_TYPE:
            raise ValueError(f"model_type {d.get('model_type')!r} is not {MODEL_TYPE!r}")
        if d.get("query_init", "learned") not in QUERY_INITS:
            raise ValueError(f"query_init must be one of {QUERY_INITS}, got {d['query_init']!r}")
        if d.get("hidden_act", "silu") != "silu" or d.get("attention_bias", False):
            raise ValueError("only silu MLPs without attention bias are supported")
        names = set(cls.__dataclass_fields__) - {"extra"}
        kw = {k: d[k] for k in names if k in d}
        kw.setdefault("num_key_value_heads", d["num_attention_heads"])
        skip = names | {"model_type", "architectures", "hidden_act", "torch_dtype",
                        "attention_bias"}
        return cls(**kw, extra={k: v for k, v in d.items() if k not in skip})


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype)


def rotary(x, positions, theta: float):
    """Llama rotary (HF's rotate-half, i.e. vLLM's neox style). x [R, H, D], positions [R]."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = positions.float()[:, None] * inv_freq[None]  # [R, D/2]
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return (x.float() * cos + torch.cat([-x2, x1], -1).float() * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: AsArmConfig) -> None:
        super().__init__()
        self.c = c
        h, nh, nkv, d = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(h, nh * d, bias=False)
        self.k_proj = nn.Linear(h, nkv * d, bias=False)
        self.v_proj = nn.Linear(h, nkv * d, bias=False)
        self.o_proj = nn.Linear(nh * d, h, bias=False)

    def forward(self, x, row_positions, num_content: int, mask):
        """x [R, H] (content rows first), row_positions [R], mask [R, L] bool (L content)."""
        c, r = self.c, x.shape[0]
        q = rotary(self.q_proj(x).view(r, c.num_attention_heads, c.head_dim), row_positions,
                   c.rope_theta)
        kv_x, kv_pos = x[:num_content], row_positions[:num_content]  # query rows give no K/V
        nkv = c.num_key_value_heads
        k = rotary(self.k_proj(kv_x).view(num_content, nkv, c.head_dim), kv_pos, c.rope_theta)
        v = self.v_proj(kv_x).view(num_content, nkv, c.head_dim)
        rep = c.num_attention_heads // c.num_key_value_heads  # GQA: heads share a K/V head
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        scores = torch.einsum("rhd,lhd->hrl", q, k) * c.head_dim ** -0.5  # [heads, R, L]
        scores = scores.masked_fill(~mask[None], float("-inf"))
        probs = torch.softmax(scores.float(), -1).nan_to_num(0.0).to(v.dtype)  # no key: 0
        out = torch.einsum("hrl,lhd->rhd", probs, v).reshape(r, -1)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, c: AsArmConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: AsArmConfig) -> None:
        super().__init__()
        self.self_attn, self.mlp = Attention(c), MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, row_positions, num_content, mask):
        x = x + self.self_attn(self.input_layernorm(x), row_positions, num_content, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class AnySubsetLlamaModel(nn.Module):
    def __init__(self, c: AsArmConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.query_embed = nn.Parameter(torch.zeros(c.hidden_size))  # query stream's start


def stream_masks(order, query_rank):
    """Content mask [L, L]: a sees b iff order[b] <= order[a] (visible tokens, rank 0, see each
    other; a generated token sees the visible ones, the earlier ones and itself).
    Query mask [Q, L]: query q sees b iff order[b] < query_rank[q]."""
    content = order[None, :] <= order[:, None]
    query = order[None, :] < query_rank[:, None]
    return content, query


def query_ranks(positions, order, query_positions):
    """rank(p) = order of the token at p if there is one, else +inf (sees every token)."""
    hit = query_positions[:, None] == positions[None, :]  # [Q, L]
    rank = torch.where(hit, order[None, :], torch.full_like(hit, INF_RANK, dtype=torch.long))
    rank = rank.min(-1).values if positions.numel() else torch.full_like(query_positions,
                                                                         INF_RANK)
    if bool((rank == 0).any()):
        raise ValueError("cannot query a visible position")
    return rank


def check_inputs(tokens, positions, order) -> None:
    if not tokens.shape == positions.shape == order.shape or tokens.dim() != 1:
        raise ValueError("tokens, positions and order must be 1-D and of equal length")
    if positions.unique().numel() != positions.numel():
        raise ValueError("a position holds at most one token")
    gen = order[order > 0]
    if bool((order < 0).any()) or gen.unique().numel() != gen.numel():
        raise ValueError("order: 0 for visible tokens, distinct ranks >= 1 for generated ones")


class AnySubsetLlamaForCausalLM(nn.Module):
    def __init__(self, config: AsArmConfig) -> None:
        super().__init__()
        self.config = config
        self.model = AnySubsetLlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.no_grad()
    def streams(self, tokens, positions, order, query_positions):
        """Final-norm hidden states: (content [L, H], query [Q, H])."""
        check_inputs(tokens, positions, order)
        c_mask, q_mask = stream_masks(order, query_ranks(positions, order, query_positions))
        m = self.model
        num_content, num_q = tokens.numel(), query_positions.numel()
        x = torch.cat([m.embed_tokens(tokens), m.query_embed.expand(num_q, -1)])  # [L+Q, H]
        row_positions = torch.cat([positions, query_positions])
        mask = torch.cat([c_mask, q_mask])  # [L+Q, L]
        for layer in m.layers:
            x = layer(x, row_positions, num_content, mask)
        x = m.norm(x)
        return x[:num_content], x[num_content:]

    @torch.no_grad()
    def content_and_query(self, tokens, positions, order, query_positions):
        """logits [Q, V] float32: row q is p(x_{query_positions[q]} | tokens of lower rank)."""
        _, g = self.streams(tokens, positions, order, query_positions)
        return self.lm_head(g).float()

    # ------------------------------------------------------------------ checkpoint
    def save_pretrained(self, path) -> Path:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(self.config.to_json(), indent=2))
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        if self.config.tie_word_embeddings:
            state.pop("lm_head.weight")
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
        return path


def load(path, dtype: torch.dtype = torch.float32) -> AnySubsetLlamaForCausalLM:
    from safetensors.torch import load_file

    path = Path(path)
    config = AsArmConfig.from_json(json.loads((path / "config.json").read_text()))
    model = AnySubsetLlamaForCausalLM(config)
    state = load_file(str(path / "model.safetensors"))
    if config.tie_word_embeddings:
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    model.load_state_dict(state, strict=True)
    return model.to(dtype).eval()


def random_asarm(config: AsArmConfig, seed: int = 0, std: float = 0.2
                 ) -> AnySubsetLlamaForCausalLM:
    """Random fp32 AS-ARM; larger ``std`` gives peakier, more context-dependent conditionals."""
    gen = torch.Generator().manual_seed(seed)
    model = AnySubsetLlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model.eval()
