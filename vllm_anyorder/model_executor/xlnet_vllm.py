"""vLLM model class for XLNet-format AS-ARMs (``XLNetLMHeadModel`` checkpoints).

Guo & Ermon's AS-ARMs are XLNet models (App. D); ``xlnet_asarm.XLNetAsArm`` drives them
through ``transformers`` (the engine-free reference). This is the same network on vLLM's
paged engine, with the semantics of the Llama-based AS-ARM (``asarm_vllm.py``):

* the engine sequence is the generation order; token rows are XLNet's **content stream**
  (word embedding, no position), writing K/V; the prompt attends bidirectionally, generated
  tokens causally (``asarm_attention.AsArmBuilderMixin``);
* the **query stream** (``mask_emb``) runs beside it at every layer: one row per token row
  from the last prompt token on, positioned at the position it predicts (the next sequence
  index, an infill request's next masked position), reading the cache without writing;
  its logits are p(x_{next} | decoded tokens), so vLLM's sampler and rejection sampler apply;
* attention is XLNet's relative-position attention over the paged cache
  (``attention_backends/xlnet_relative.py``); keys' true positions are recorded per slot.

Weights load from the Hugging Face names (``transformer.layer.N.rel_attn.{q,k,v,o,r}``
[d_model, heads, head_dim], ``r_{w,r,s}_bias``, ``ff.layer_{1,2}``, ``layer_norm``,
``transformer.word_embedding``, ``transformer.mask_emb``, ``lm_loss.bias``; ``lm_loss``
tied to the embedding). Tensor parallel: heads and the feed-forward are sharded, the
attention output is all-reduced. ``anyorder_banned_token_ids`` in config.json get -inf
logits (the paper bans XLNet's ``<mask>``). Any device: the attention is the plugin's
PyTorch implementation (``asarm_torch.AsArmTorchBackend``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.model_loader.weight_utils import default_weight_loader

from vllm_anyorder.attention_backends import xlnet_relative as rel
from vllm_anyorder.attention_backends.asarm_attention import (
    apply_runner_patches,
    forward_stream_positions,
)
from vllm_anyorder.attention_backends.metadata import layer_metadata
from vllm_anyorder.attention_backends.paged_torch import write_kv
from vllm_anyorder.attention_backends.selection import backend_for
from vllm_anyorder.model_executor.asarm_vllm import QueryPlan, _forward_context


def _head_parameter(*shape: int, head_dim: int) -> nn.Parameter:
    """A parameter holding this rank's heads along dim ``head_dim`` of the checkpoint's."""
    param = nn.Parameter(torch.zeros(*shape), requires_grad=False)
    rank, size = get_tensor_model_parallel_rank(), shape[head_dim]

    def load(p: nn.Parameter, full: torch.Tensor) -> None:
        p.data.copy_(full.narrow(head_dim, rank * size, size))

    param.weight_loader = load
    return param


class XLNetRelativeAttention(nn.Module):
    def __init__(self, config, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        if config.n_head % tp:
            raise ValueError(f"XLNet: n_head {config.n_head} not divisible by TP size {tp}")
        d_model, heads, d = config.d_model, config.n_head // tp, config.d_head
        self.num_heads, self.head_dim = heads, d
        for name in ("q", "k", "v", "o", "r"):
            setattr(self, name, _head_parameter(d_model, heads, d, head_dim=1))
        for name in ("r_w_bias", "r_r_bias", "r_s_bias"):
            setattr(self, name, _head_parameter(heads, d, head_dim=0))
        self.seg_embed = _head_parameter(2, heads, d, head_dim=1)  # one segment: unused
        self.layer_norm = nn.LayerNorm(d_model, eps=config.layer_norm_eps)
        self.attn = Attention(heads, d, d ** -0.5, num_kv_heads=heads,
                              cache_config=vllm_config.cache_config,
                              quant_config=vllm_config.quant_config, prefix=f"{prefix}.attn",
                              attn_backend=backend_for("xlnet", "XLNetLMHeadModel"))
        self.max_distance = vllm_config.model_config.max_model_len + 2
        self.clamp_len = int(getattr(config, "clamp_len", -1) or -1)
        self._scoring: rel.RelativeScoring | None = None

    def scoring(self) -> rel.RelativeScoring:
        if self._scoring is None:  # weights are fixed after loading: build once
            self._scoring = rel.RelativeScoring(
                self.r_w_bias.float(), self.r_r_bias.float(),
                rel.relative_key_table(self.r.data, self.max_distance, self.clamp_len),
                self.max_distance, self.head_dim ** -0.5)
        return self._scoring

    def _post(self, x: torch.Tensor, attn_vec: torch.Tensor) -> torch.Tensor:
        out = torch.einsum("ind,hnd->ih", attn_vec, self.o)
        return self.layer_norm(tensor_model_parallel_all_reduce(out) + x)

    def forward(self, h, g, positions, query_positions, keys: rel.SlotPositions,
                plan: QueryPlan | None):
        """h [C, d_model] content rows at ``positions``; g [Q, d_model] query rows at
        ``query_positions`` -> (h, g) after attention, residual and layer norm."""
        k = torch.einsum("ih,hnd->ind", h, self.k)
        v = torch.einsum("ih,hnd->ind", h, self.v)
        metadata = layer_metadata(self.attn.layer_name) if plan is None else plan.content
        query_md = getattr(metadata, "query_metadata", None) if plan is None else plan.queries
        if plan is None and query_md is None:
            query_md = metadata  # no prompt lengths known: row j's query sees what row j saw
        slots = plan.slots if plan is not None else \
            (metadata.slot_mapping if metadata is not None else None)
        if slots is not None:
            write_kv(self.attn.kv_cache, k, v, slots)
        scoring = self.scoring()
        qh = torch.einsum("ih,hnd->ind", h, self.q)
        qg = torch.einsum("ih,hnd->ind", g, self.q)
        oh = rel.paged_relative_attention(qh, positions, self.attn.kv_cache, metadata, keys,
                                          scoring)
        og = rel.paged_relative_attention(qg, query_positions, self.attn.kv_cache, query_md,
                                          keys, scoring)
        return self._post(h, oh), self._post(g, og)


class XLNetFeedForward(nn.Module):
    def __init__(self, config, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        quant = vllm_config.quant_config
        self.layer_1 = ColumnParallelLinear(config.d_model, config.d_inner, bias=True,
                                            quant_config=quant, prefix=f"{prefix}.layer_1")
        self.layer_2 = RowParallelLinear(config.d_inner, config.d_model, bias=True,
                                         quant_config=quant, prefix=f"{prefix}.layer_2")
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.act = ACT2FN[config.ff_activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.layer_1(x)
        y, _ = self.layer_2(self.act(y))
        return self.layer_norm(y + x)


class XLNetLayer(nn.Module):
    def __init__(self, config, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        self.rel_attn = XLNetRelativeAttention(config, vllm_config, f"{prefix}.rel_attn")
        self.ff = XLNetFeedForward(config, vllm_config, f"{prefix}.ff")

    def forward(self, h, g, positions, query_positions, keys, plan):
        h, g = self.rel_attn(h, g, positions, query_positions, keys, plan)
        return self.ff(h), self.ff(g)


class XLNetTransformer(nn.Module):
    def __init__(self, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.word_embedding = VocabParallelEmbedding(config.vocab_size, config.d_model)
        self.mask_emb = nn.Parameter(torch.zeros(1, 1, config.d_model), requires_grad=False)
        self.layer = nn.ModuleList(XLNetLayer(config, vllm_config, f"{prefix}.layer.{i}")
                                   for i in range(config.n_layer))
        self.keys = rel.SlotPositions()

    def forward(self, input_ids, positions, query_positions=None, plan=None):
        """As ``asarm_vllm.AsArmModel.forward``: vLLM's forward (no ``query_positions``)
        returns [T, d_model] with the query stream's states at the planned rows (zeros
        elsewhere); a proposer forward returns the query rows' states."""
        h = self.word_embedding(input_ids)
        rows = None
        if query_positions is None:
            layer_name = self.layer[0].rel_attn.attn.layer_name
            rows, positions, query_positions = forward_stream_positions(layer_name, positions)
            metadata = layer_metadata(layer_name)
            if metadata is not None:
                self.keys.write(metadata.slot_mapping[: metadata.num_actual_tokens],
                                positions[: metadata.num_actual_tokens])
        else:
            self.keys.write(plan.slots, positions)
        g = self.mask_emb.reshape(1, -1).to(h.dtype).expand(query_positions.shape[0], -1)
        for layer in self.layer:
            h, g = layer(h, g, positions, query_positions, self.keys, plan)
        if rows is None:
            return g
        out = g.new_zeros(h.shape[0], g.shape[-1])
        out[rows] = g
        return out


class XLNetAnySubsetLM(nn.Module):
    """vLLM model for ``architectures = ["XLNetLMHeadModel"]`` checkpoints, served as an
    AS-ARM (the interface of ``asarm_vllm.AnySubsetLlamaForCausalLM``)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        apply_runner_patches()  # the attention builder sees prompt ends and infill positions
        config = vllm_config.model_config.hf_config
        self.config = config
        self.transformer = XLNetTransformer(vllm_config, "transformer")
        self.lm_loss = ParallelLMHead(config.vocab_size, config.d_model, bias=True,
                                      prefix="lm_loss")
        self.lm_loss = self.lm_loss.tie_weights(self.transformer.word_embedding)
        self.logits_processor = LogitsProcessor(config.vocab_size)
        self.banned_token_ids = list(getattr(config, "anyorder_banned_token_ids", None) or [])
        self.target_forwards = 0  # diagnostics, as the Llama-based AS-ARM
        self.query_forwards = 0

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.transformer.word_embedding(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None,
                **kwargs) -> torch.Tensor:
        self.target_forwards += 1
        return self.transformer(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        logits = self.logits_processor(self.lm_loss, hidden_states, self.lm_loss.bias)
        if logits is not None and self.banned_token_ids:
            logits[:, self.banned_token_ids] = float("-inf")
        return logits

    @torch.inference_mode()
    def query_logits(self, input_ids, positions, query_positions, plan: QueryPlan,
                     vllm_config: VllmConfig) -> torch.Tensor:
        """Write the content rows into the cache, then run query rows -> logits [Q, V]."""
        self.query_forwards += 1
        with _forward_context(vllm_config):
            return self.compute_logits(self.transformer(input_ids, positions,
                                                        query_positions, plan))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if name == "lm_loss.weight":  # tied to the word embedding
                continue
            param = params[name]
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        return loaded
