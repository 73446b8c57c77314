"""vLLM model classes for diffusion LLMs: LLaDA (``LLaDAModelLM``) and Dream (``DreamModel``).

The same checkpoints and math as the pure-PyTorch ``llada.py`` / ``dream.py`` (their docstrings
describe the released formats), on vLLM's layers (tensor-parallel linears, paged KV cache):
pre-norm blocks of bidirectional attention with rotate-half rotary at the true positions and a
SwiGLU MLP; LLaDA without biases (optionally tied head, ``input_emb_norm``, ``scale_logits``),
Dream with q/k/v biases, an untied head and the logit shift (row i predicts token i + 1,
``logit_shift = 1``; LLaDA's row i predicts token i).

Attention is block-causal over the paged cache (``attention_backends/dllm_plans.py``). vLLM's
own forward writes the committed prefix; :meth:`DllmForDiffusionLM.row_logits` runs the
denoising / verification forwards of the ``dllm`` proposer (``proposers/dllm.py``) with a
:class:`~vllm_anyorder.attention_backends.dllm_plans.RowPlan`. Prompts are prefilled in one step
and prefix caching is off (``engine_configs.DllmEngineConfig``). Attention: vLLM's CPU op or
the plugin's PyTorch implementation (``attention_backends/selection.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.model_loader.weight_utils import default_weight_loader

from vllm_anyorder.attention_backends.dllm_plans import RowPlan, node_attention
from vllm_anyorder.attention_backends.selection import backend_for


@dataclass(frozen=True)
class DllmShape:
    """The architecture numbers both formats reduce to."""

    hidden: int
    heads: int
    kv_heads: int
    layers: int
    intermediate: int
    rows: int  # embedding / LM-head rows (logit width)
    vocab: int
    eps: float
    rope_theta: float
    max_positions: int
    qkv_bias: bool
    tied: bool
    emb_scale: float  # multiply embeddings (LLaDA input_emb_norm: sqrt(d))
    logit_scale: float  # multiply logits (LLaDA scale_logits: 1/sqrt(d))
    logit_shift: int
    mask_id: int
    eos_id: int | None


def _theta(c, default: float) -> float:
    params = getattr(c, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(c, "rope_theta", None) or default)


def llada_shape(c) -> DllmShape:
    d = c.d_model
    inter = getattr(c, "mlp_hidden_size", None) or getattr(c, "mlp_ratio", 4) * d
    rows = getattr(c, "embedding_size", None) or c.vocab_size
    return DllmShape(
        hidden=d, heads=c.n_heads, kv_heads=getattr(c, "n_kv_heads", None) or c.n_heads,
        layers=c.n_layers, intermediate=inter, rows=rows, vocab=c.vocab_size,
        eps=getattr(c, "rms_norm_eps", 1e-5), rope_theta=_theta(c, 500000.0),
        max_positions=getattr(c, "max_sequence_length", 4096),
        qkv_bias=bool(getattr(c, "include_qkv_bias", False)),
        tied=bool(getattr(c, "weight_tying", False)),
        emb_scale=d ** 0.5 if getattr(c, "input_emb_norm", False) else 1.0,
        logit_scale=d ** -0.5 if getattr(c, "scale_logits", False) else 1.0,
        logit_shift=0, mask_id=int(c.mask_token_id), eos_id=getattr(c, "eos_token_id", None))


def dream_shape(c) -> DllmShape:
    return DllmShape(
        hidden=c.hidden_size, heads=c.num_attention_heads,
        kv_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
        layers=c.num_hidden_layers, intermediate=c.intermediate_size, rows=c.vocab_size,
        vocab=c.vocab_size, eps=getattr(c, "rms_norm_eps", 1e-6),
        rope_theta=_theta(c, 1000000.0), max_positions=c.max_position_embeddings,
        qkv_bias=True, tied=bool(getattr(c, "tie_word_embeddings", False)), emb_scale=1.0,
        logit_scale=1.0, logit_shift=1, mask_id=int(c.mask_token_id),
        eos_id=getattr(c, "eos_token_id", None))


class DllmAttention(nn.Module):
    def __init__(self, s: DllmShape, cache_config, quant_config, prefix: str) -> None:
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        self.head_dim = s.hidden // s.heads
        self.num_heads, self.num_kv_heads = s.heads // tp, max(1, s.kv_heads // tp)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(s.hidden, self.head_dim, s.heads, s.kv_heads,
                                          bias=s.qkv_bias, quant_config=quant_config,
                                          prefix=f"{prefix}.qkv_proj")
        self.o_proj = RowParallelLinear(s.heads * self.head_dim, s.hidden, bias=False,
                                        quant_config=quant_config, prefix=f"{prefix}.o_proj")
        self.rotary_emb = get_rope(self.head_dim, max_position=s.max_positions,
                                   is_neox_style=True,
                                   rope_parameters={"rope_type": "default",
                                                    "rope_theta": s.rope_theta})
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim ** -0.5,
                              num_kv_heads=self.num_kv_heads, cache_config=cache_config,
                              quant_config=quant_config, prefix=f"{prefix}.attn",
                              attn_backend=backend_for("dllm", "LLaDA / Dream"))

    def forward(self, positions, h, layer: int, plan: RowPlan | None):
        qkv, _ = self.qkv_proj(h)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        o = self.attn(q, k, v) if plan is None else node_attention(self.attn, layer, q, k, v, plan)
        return self.o_proj(o)[0]


class DllmLayer(nn.Module):
    def __init__(self, s: DllmShape, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        qc = vllm_config.quant_config
        self.attn_norm = RMSNorm(s.hidden, eps=s.eps)
        self.self_attn = DllmAttention(s, vllm_config.cache_config, qc, f"{prefix}.self_attn")
        self.ffn_norm = RMSNorm(s.hidden, eps=s.eps)
        self.gate_up_proj = MergedColumnParallelLinear(s.hidden, [s.intermediate] * 2,
                                                       bias=False, quant_config=qc,
                                                       prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(s.intermediate, s.hidden, bias=False,
                                           quant_config=qc, prefix=f"{prefix}.down_proj")
        self.act = SiluAndMul()

    def forward(self, positions, x, layer: int, plan: RowPlan | None):
        x = x + self.self_attn(positions, self.attn_norm(x), layer, plan)
        return x + self.down_proj(self.act(self.gate_up_proj(self.ffn_norm(x))[0]))[0]


# our parameter -> (LLaDA checkpoint name, Dream checkpoint name, shard id or None); patterns
# with (\d+) carry the layer index {i}; ([qkv]) and (weight|bias) pick the qkv shard and {w}
_B, _L = r"model\.transformer\.blocks\.(\d+)\.", r"model\.layers\.(\d+)\."
_CHECKPOINT_NAMES = [
    ("embed.weight", r"model\.transformer\.wte\.weight", r"model\.embed_tokens\.weight", None),
    ("norm.weight", r"model\.transformer\.ln_f\.weight", r"model\.norm\.weight", None),
    ("lm_head.weight", r"model\.transformer\.ff_out\.weight", r"lm_head\.weight", None),
    ("layers.{i}.attn_norm.weight", _B + r"attn_norm\.weight", _L + r"input_layernorm\.weight",
     None),
    ("layers.{i}.ffn_norm.weight", _B + r"ff_norm\.weight",
     _L + r"post_attention_layernorm\.weight", None),
    ("layers.{i}.self_attn.qkv_proj.{w}", _B + r"([qkv])_proj\.(weight|bias)",
     _L + r"self_attn\.([qkv])_proj\.(weight|bias)", "qkv"),
    ("layers.{i}.self_attn.o_proj.weight", _B + r"attn_out\.weight",
     _L + r"self_attn\.o_proj\.weight", None),
    ("layers.{i}.gate_up_proj.weight", _B + r"ff_proj\.weight", _L + r"mlp\.gate_proj\.weight", 0),
    ("layers.{i}.gate_up_proj.weight", _B + r"up_proj\.weight", _L + r"mlp\.up_proj\.weight", 1),
    ("layers.{i}.down_proj.weight", _B + r"ff_out\.weight", _L + r"mlp\.down_proj\.weight", None),
]
# checkpoint name -> (our name, shard id or None), per format
_LLADA_NAMES = [(llada, ours, shard) for ours, llada, _, shard in _CHECKPOINT_NAMES]
_DREAM_NAMES = [(dream, ours, shard) for ours, _, dream, shard in _CHECKPOINT_NAMES]

class DllmForDiffusionLM(nn.Module):
    """Shared vLLM model of both formats (subclasses pick the shape reader and names)."""

    shape_of = staticmethod(llada_shape)
    checkpoint_names = _LLADA_NAMES

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        self.shape = s = type(self).shape_of(vllm_config.model_config.hf_config)
        self.logit_shift, self.mask_id, self.eos_id = s.logit_shift, s.mask_id, s.eos_id
        self.embed = VocabParallelEmbedding(s.rows, s.hidden)
        self.layers = nn.ModuleList(DllmLayer(s, vllm_config, f"{prefix}layers.{i}")
                                    for i in range(s.layers))
        self.norm = RMSNorm(s.hidden, eps=s.eps)
        self.lm_head = ParallelLMHead(s.rows, s.hidden, prefix=f"{prefix}lm_head")
        if s.tied:
            self.lm_head = self.lm_head.tie_weights(self.embed)
        self.logits_processor = LogitsProcessor(s.rows, org_vocab_size=s.vocab,
                                                scale=s.logit_scale)
        self.vllm_config = vllm_config
        self.target_forwards = 0  # vLLM's own forwards (diagnostics)
        self.row_forwards = 0  # the proposer's denoising / verification / repair forwards

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        return x * self.shape.emb_scale if self.shape.emb_scale != 1.0 else x

    def _run(self, input_ids, positions, plan: RowPlan | None, inputs_embeds=None):
        x = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        for i, layer in enumerate(self.layers):
            x = layer(positions, x, i, plan)
        return self.norm(x)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None,
                **kwargs) -> torch.Tensor:
        self.target_forwards += 1
        return self._run(input_ids, positions, None, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    @torch.inference_mode()
    def row_logits(self, input_ids, positions, plan: RowPlan) -> torch.Tensor:
        """Logits [R, V] of rows (``input_ids`` at absolute ``positions``) under ``plan``."""
        from vllm_anyorder import _compat

        self.row_forwards += 1
        with _compat.set_forward_context(None, self.vllm_config):
            return self.compute_logits(self._run(input_ids, positions, plan))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        table = [(re.compile(p + "$"), t, shard) for p, t, shard in type(self).checkpoint_names]
        loaded = set()
        for name, tensor in weights:
            for pattern, target, shard in table:
                m = pattern.match(name)
                if m is None:
                    continue
                groups = m.groups()
                key = target.format(i=groups[0] if groups else "", w=groups[-1] if groups else "")
                if shard == "qkv":
                    shard = groups[1]
                if key == "lm_head.weight" and self.shape.tied:
                    break  # tied: the embedding is the head
                param = params[key]
                loader = getattr(param, "weight_loader", default_weight_loader)
                loader(param, tensor) if shard is None else loader(param, tensor, shard)
                loaded.add(key)
                break
            else:
                raise ValueError(f"unexpected weight {name!r} in a {type(self).__name__} "
                                 f"checkpoint")
        return loaded


class LLaDAForDiffusionLM(DllmForDiffusionLM):
    """``architectures = ["LLaDAModelLM"]`` checkpoints."""


class DreamForDiffusionLM(DllmForDiffusionLM):
    """``architectures = ["DreamModel"]`` checkpoints."""

    shape_of = staticmethod(dream_shape)
    checkpoint_names = _DREAM_NAMES
