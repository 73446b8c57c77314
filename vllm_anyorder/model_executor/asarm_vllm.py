"""vLLM model class for ``anyorder_llama`` checkpoints (two-stream AS-ARM on Llama weights).

The same checkpoint and semantics as the pure-PyTorch ``asarm.py`` (Guo & Ermon, Sec. 4 /
App. D), laid out for vLLM's paged engine, which generates left to right:

* The engine sequence is the generation order; the normal token rows are the **content
  stream** (rotary at the true position: the sequence index, or for an infill request its
  position table, ``attention_backends/asarm_positions.py``) and write the KV cache. The
  prompt is visible: its prefill is bidirectional (``asarm_attention.AsArmBuilderMixin``),
  generated tokens are causal.
* At every layer the **query stream** runs the same attention op a second time over the same
  cache: a row per token row from the last prompt token on (earlier rows would predict
  visible tokens), started from ``model.query_embed``, rotary at the NEXT position (the
  next masked position for an infill request), no KV
  write. Row j's logits are p(x_{pos_j + 1} | tokens up to pos_j): an AR model's logits, so
  vLLM's sampler and rejection sampler apply unchanged. The hidden states vLLM sees are the
  query stream's (zeros for rows without a query).
* :meth:`AnySubsetLlamaForCausalLM.query_logits` runs arbitrary query rows over the paged
  cache (the proposer drafts k future positions at once: each row attends to the decoded
  prefix only) after writing a few content rows (the last sampled token, not yet cached).

Constraints this layout imposes (set by :class:`AsArmEngineConfig` at engine start-up):
prompts are prefilled in one step (no chunked prefill: a chunk could not see later chunks)
and without prefix caching (a cached prompt block was computed seeing only its own prompt).
Prompt logprobs are not computed (visible tokens have no query row). Attention: vLLM's CPU
op or the plugin's PyTorch implementation (``attention_backends/selection.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.models.llama import LlamaMLP, LlamaModel
from vllm.model_executor.models.utils import AutoWeightsLoader, make_layers, maybe_prefix

from vllm_anyorder.attention_backends.asarm_attention import (
    apply_runner_patches,
    content_attention,
    forward_stream_positions,
    query_attention,
)
from vllm_anyorder.attention_backends.selection import backend_for
from vllm_anyorder.model_executor.asarm import ARCHITECTURE


@dataclass(frozen=True)
class QueryPlan:
    """Attention inputs of a :meth:`query_logits` forward (built by the proposer).

    ``content`` metadata + ``slots`` [R] for the content rows (written to the cache, causal);
    ``queries`` metadata for the query rows (prefix-only, never written)."""

    content: Any
    slots: torch.Tensor
    queries: Any


class AsArmAttention(nn.Module):
    def __init__(self, config, cache_config, quant_config, prefix: str) -> None:
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        self.total_num_heads = config.num_attention_heads
        self.total_num_kv_heads = getattr(config, "num_key_value_heads", None) or \
            config.num_attention_heads
        self.num_heads = self.total_num_heads // tp
        self.num_kv_heads = max(1, self.total_num_kv_heads // tp)
        self.head_dim = getattr(config, "head_dim", None) or \
            config.hidden_size // self.total_num_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, self.head_dim, self.total_num_heads, self.total_num_kv_heads,
            bias=False, quant_config=quant_config, prefix=f"{prefix}.qkv_proj")
        self.o_proj = RowParallelLinear(
            self.total_num_heads * self.head_dim, config.hidden_size, bias=False,
            quant_config=quant_config, prefix=f"{prefix}.o_proj")
        # +1: the query stream of the last position sits one position further
        self.rotary_emb = get_rope(
            self.head_dim, max_position=getattr(config, "max_position_embeddings", 8192) + 1,
            rope_parameters=getattr(config, "rope_parameters", None), is_neox_style=True)
        self.attn = Attention(
            self.num_heads, self.head_dim, self.head_dim ** -0.5, num_kv_heads=self.num_kv_heads,
            cache_config=cache_config, quant_config=quant_config, prefix=f"{prefix}.attn",
            attn_backend=backend_for("asarm", ARCHITECTURE))

    def forward(self, positions, query_positions, h, num_content: int,
                plan: QueryPlan | None = None):
        """h [C + Q, H]: content rows then query rows."""
        qkv, _ = self.qkv_proj(h)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        qc, kc, vc = q[:num_content], k[:num_content], v[:num_content]
        qq = q[num_content:]  # query rows' own keys/values are never used
        qc, kc = self.rotary_emb(positions, qc, kc)
        qq, _ = self.rotary_emb(query_positions, qq, None)
        if plan is None:  # vLLM's forward: its metadata and slot mapping, then the same reads
            oc = self.attn(qc, kc, vc)
            oq = query_attention(self.attn, qq)
        else:
            oc = content_attention(self.attn, qc, kc, vc, plan.content, plan.slots)
            oq = query_attention(self.attn, qq, plan.queries)
        out, _ = self.o_proj(torch.cat([oc, oq]))
        return out


class AsArmDecoderLayer(nn.Module):
    def __init__(self, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.self_attn = AsArmAttention(config, vllm_config.cache_config,
                                        vllm_config.quant_config, f"{prefix}.self_attn")
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act,
                            quant_config=vllm_config.quant_config, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions, query_positions, h, residual, num_content, plan):
        if residual is None:
            residual, h = h, self.input_layernorm(h)
        else:
            h, residual = self.input_layernorm(h, residual)
        h = self.self_attn(positions, query_positions, h, num_content, plan)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class AsArmModel(nn.Module):
    hf_to_vllm_mapper = LlamaModel.hf_to_vllm_mapper  # q/k/v -> qkv_proj, gate/up -> gate_up

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size,
                                                   quant_config=vllm_config.quant_config)
        _, _, self.layers = make_layers(
            config.num_hidden_layers,
            lambda prefix: AsArmDecoderLayer(vllm_config=vllm_config, prefix=prefix),
            prefix=f"{prefix}.layers")
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.query_embed = nn.Parameter(torch.zeros(config.hidden_size))  # query stream start

    def forward(self, input_ids, positions, query_positions=None, plan=None,
                inputs_embeds=None) -> torch.Tensor:
        """Content rows = the tokens; query rows at ``query_positions``. Without them (vLLM's
        forward): a query row at the next position for every token row the attention plan
        selects (not for rows that would predict a prompt position), returned as [T, H]
        with zeros elsewhere. Otherwise returns the query rows' final hidden states."""
        x = inputs_embeds if inputs_embeds is not None else self.embed_tokens(input_ids)
        rows = None
        if query_positions is None:
            layer_name = self.layers[0].self_attn.attn.layer_name
            rows, positions, query_positions = forward_stream_positions(layer_name, positions)
        num_content = x.shape[0]
        g = self.query_embed.to(x.dtype).expand(query_positions.shape[0], -1)
        h, residual = torch.cat([x, g]), None
        for layer in self.layers:
            h, residual = layer(positions, query_positions, h, residual, num_content, plan)
        h, _ = self.norm(h, residual)
        if rows is None:
            return h[num_content:]
        out = h.new_zeros(num_content, h.shape[-1])
        out[rows] = h[num_content:]
        return out

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)


class AnySubsetLlamaForCausalLM(nn.Module):
    """vLLM model for ``architectures = ["AnySubsetLlamaForCausalLM"]`` checkpoints."""

    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        apply_runner_patches()  # the attention builder sees prompt ends and infill positions
        config = vllm_config.model_config.hf_config
        self.config = config
        self.model = AsArmModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size,
                                      quant_config=vllm_config.quant_config,
                                      prefix=maybe_prefix(prefix, "lm_head"))
        if config.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)
        # diagnostics: forwards of vLLM's runner and of the proposer (tests, benchmarks)
        self.target_forwards = 0
        self.query_forwards = 0

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None,
                **kwargs) -> torch.Tensor:
        self.target_forwards += 1
        return self.model(input_ids, positions, inputs_embeds=inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    @torch.inference_mode()
    def query_logits(self, input_ids, positions, query_positions, plan: QueryPlan,
                     vllm_config: VllmConfig) -> torch.Tensor:
        """Write the content rows (``input_ids`` at ``positions``) into the cache, then run
        query rows at ``query_positions`` with ``plan``'s metadata -> logits [Q, V]."""
        self.query_forwards += 1
        with _forward_context(vllm_config):
            hidden = self.model(input_ids, positions, query_positions, plan)
            return self.compute_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # tied embeddings: vLLM's loader loads the shared parameter once
        return AutoWeightsLoader(self).load_weights(weights)


def _forward_context(vllm_config: VllmConfig):
    from vllm_anyorder import _compat

    return _compat.set_forward_context(None, vllm_config)


assert AnySubsetLlamaForCausalLM.__name__ == ARCHITECTURE
