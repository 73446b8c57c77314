"""Two-stream (AS-ARM) attention over the paged KV cache: the masks and the stream helpers,
shared by the two implementations (``asarm_cpu.py``: vLLM's CPU op; ``asarm_torch.py``: the
device-agnostic PyTorch one). Checked against a dense reference in
``tests/e2e/test_asarm_model.py`` and ``tests/unit/adapters/test_assd_proposer.py``.

* **Prompt bidirectional, generated tokens causal.** Every visible (prompt) token attends to
  the whole prompt; a generated token attends to the prompt and to the tokens generated before
  it (Guo & Ermon, Eq. 4/6). :class:`AsArmBuilderMixin` turns that into per-request causal
  flags of vLLM's ``CommonAttentionMetadata``, knowing each request's prompt length (patch
  ``asarm_prompt_lens``): a whole-prompt prefill runs bidirectionally (vLLM prefills an AS-ARM
  prompt in one step: the model turns chunked prefill and prefix caching off), decoding and
  verification causally, and a request whose rows cross the prompt end (a preempted request
  recomputed as prompt + outputs; vLLM's spec-decode padding of a 1-token prompt to
  ``[token, -1 x k]``) is split into a bidirectional prompt part and a causal rest over the
  same block-table row. The implementation's own builder (``super().build``) then turns the
  flags into its metadata.
* **The query stream reads, never writes.** A query row carries no token: its K/V are never
  written (the implementation is called without the cache update), and it attends to the
  content K/V that the same layer has just written. With the forward's own metadata, query
  row j sees what content row j sees (vLLM's target forward); with
  ``metadata.prefix_metadata`` (causal off, ``seq_len`` = the decoded prefix), every query row
  sees exactly the decoded prefix (drafting).
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, replace
from typing import Any

import torch

from vllm_anyorder.attention_backends import asarm_positions
from vllm_anyorder.attention_backends.metadata import layer_metadata

# Prompt lengths of the runner's input batch (row order), set around metadata building by
# the ``asarm_prompt_lengths`` patch; None outside it (e.g. the proposer's own metadata).
PROMPT_LENS: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar(
    "anyorder_asarm_prompt_lens", default=None)


@dataclass
class AsArmFields:
    """What an AS-ARM forward's metadata adds to its implementation's: where the query stream
    runs, ``query_rows`` [Rq] (token rows whose next position is not a prompt position) and
    ``query_metadata`` (those rows, causal: row of sequence index i sees keys [0, i]); for
    infill requests (``asarm_positions``) the true rotary positions of the content rows
    [num_actual_tokens] and of the query rows [Rq] (None: sequence indices). A metadata
    class lists it first among its bases (its fields all have defaults)."""

    query_rows: torch.Tensor | None = None
    query_metadata: Any = None
    positions: torch.Tensor | None = None
    query_positions: torch.Tensor | None = None


class AsArmBuilderMixin:
    """The AS-ARM rule per request and per row over an implementation's builder (listed
    before it among the bases; ``METADATA`` = that implementation's metadata class with
    :class:`AsArmFields`): prompt rows attend to the whole prompt, every later row
    (generated, drafted, or vLLM's -1 placeholders after a 1-token prompt) causally. In
    vLLM's forward (prompt lengths known) it also plans the query stream: a query row that
    would predict a prompt position is meaningless (visible tokens are never queried), so only
    the last prompt row and the rows after it get one: a prompt costs one query row, not one
    per token."""

    METADATA: type

    def build(self, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False):
        cm = common_attn_metadata
        if cm.causal is not True:  # explicit metadata (the proposer's) is left alone
            return super().build(common_prefix_len, cm, fast_build)
        prompt_lens = PROMPT_LENS.get()
        content = super().build(common_prefix_len, _prompt_bidirectional(cm, prompt_lens),
                                fast_build)
        if prompt_lens is None:
            return content
        rows, query_cm = _query_rows(cm, prompt_lens)
        positions = query_positions = None
        tables = asarm_positions.POSITION_TABLES.get()
        if tables is not None:
            positions, query_positions = asarm_positions.row_positions(cm, tables, rows)
        return self.METADATA(**vars(content), query_rows=rows,
                             query_metadata=super().build(0, query_cm, fast_build),
                             positions=positions, query_positions=query_positions)


def _query_rows(cm: Any, prompt_lens: torch.Tensor):
    """Rows of sequence index >= prompt length - 1 (their query predicts a non-prompt
    position), and causal metadata for exactly those rows."""
    num_reqs = cm.num_reqs
    qsl = cm.query_start_loc_cpu[: num_reqs + 1].to(torch.int64).tolist()
    seq_lens = cm.seq_lens[:num_reqs].cpu().to(torch.int64).tolist()
    prompts = prompt_lens[:num_reqs].to(torch.int64).tolist()
    rows, counts = [], []
    for i in range(num_reqs):
        q, s = qsl[i + 1] - qsl[i], seq_lens[i]
        start = max(s - q, prompts[i] - 1)  # first sequence index with a query row
        n = max(0, s - start)
        rows.append(torch.arange(qsl[i + 1] - n, qsl[i + 1]))
        counts.append(n)
    rows = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int64)
    new_qsl = torch.zeros(num_reqs + 1, dtype=cm.query_start_loc_cpu.dtype)
    new_qsl[1:] = torch.cumsum(torch.tensor(counts), 0)
    device = cm.seq_lens.device
    query_cm = replace(cm, query_start_loc=new_qsl.to(device), query_start_loc_cpu=new_qsl,
                       num_actual_tokens=int(new_qsl[-1]), max_query_len=max(counts, default=0),
                       causal=True)
    return rows.to(device), query_cm


def _prompt_bidirectional(cm: Any, prompt_lens: torch.Tensor | None) -> Any:
    """Per-request causal flags, splitting a request whose rows straddle the prompt end into
    a bidirectional prompt part (keys = the prompt) and a causal rest (same block row)."""
    num_reqs = cm.num_reqs
    qsl = cm.query_start_loc_cpu[: num_reqs + 1].to(torch.int64)
    query_lens = (qsl[1:] - qsl[:-1]).tolist()
    seq_lens = cm.seq_lens[:num_reqs].cpu().to(torch.int64).tolist()
    if prompt_lens is None:  # no prompt lengths: a request starting at 0 is a whole prompt
        prompts = [s if s == q else 0 for q, s in zip(query_lens, seq_lens)]
    else:
        prompts = prompt_lens[:num_reqs].to(torch.int64).tolist()
    groups: list[tuple[int, int, int, int]] = []  # (request, rows, seq_len, causal)
    for i, (q, s, p) in enumerate(zip(query_lens, seq_lens, prompts)):
        ctx = s - q
        if q == 0 or ctx >= p:
            groups.append((i, q, s, 1))
        elif s <= p:  # only prompt rows
            groups.append((i, q, s, 0))
        else:  # prompt rows, then generated rows (preemption recompute, vLLM's padding)
            groups += [(i, p - ctx, p, 0), (i, s - p, s, 1)]
    flags = torch.tensor([g[3] for g in groups], dtype=torch.int32)
    if len(groups) == num_reqs:
        if bool((flags == 1).all()):
            return cm
        causal = False if bool((flags == 0).all()) else flags.to(cm.seq_lens.device)
        return replace(cm, causal=causal)
    device = cm.seq_lens.device
    rows = torch.tensor([g[0] for g in groups])
    new_qsl = torch.zeros(len(groups) + 1, dtype=cm.query_start_loc_cpu.dtype)
    new_qsl[1:] = torch.cumsum(torch.tensor([g[1] for g in groups]), 0)
    return replace(
        cm,
        query_start_loc=new_qsl.to(device),
        query_start_loc_cpu=new_qsl,
        seq_lens=torch.tensor([g[2] for g in groups], dtype=cm.seq_lens.dtype, device=device),
        num_reqs=len(groups),
        max_query_len=max(g[1] for g in groups),
        block_table_tensor=cm.block_table_tensor[rows.to(cm.block_table_tensor.device)],
        causal=flags.to(device),
        seq_lens_cpu_upper_bound=None,
        is_prefilling=None,
        req_idx=None,
    )


def query_attention(attn: Any, query: torch.Tensor, metadata: Any = None) -> torch.Tensor:
    """Attention of query-stream rows over the paged cache of layer ``attn``, no KV write.

    ``query`` [R, heads * head_dim] (rotary applied). ``metadata`` None uses the current
    forward's query plan of this layer (``AsArmFields.query_metadata``: the rows of
    ``query_rows``), or its content metadata when there is none (row j sees what content
    row j saw)."""
    if metadata is None:
        metadata = layer_metadata(attn.layer_name)
        metadata = getattr(metadata, "query_metadata", None) or metadata
    out = torch.empty(query.shape[0], attn.num_heads * attn.head_size_v, dtype=query.dtype,
                      device=query.device)
    if metadata is None:  # profiling / warm-up run: vLLM's own layers return garbage too
        return out.zero_()
    q = query.reshape(-1, attn.num_heads, attn.head_size)
    attn.impl.forward(attn, q, None, None, attn.kv_cache, metadata,
                      output=out.view(-1, attn.num_heads, attn.head_size_v))
    return out


def content_attention(attn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      metadata: Any, slot_mapping: torch.Tensor) -> torch.Tensor:
    """Content rows outside vLLM's forward: write their K/V at ``slot_mapping``, then attend
    with ``metadata`` (the same op vLLM's ``Attention.forward`` runs)."""
    k = k.reshape(-1, attn.num_kv_heads, attn.head_size)
    v = v.reshape(-1, attn.num_kv_heads, attn.head_size_v)
    attn.impl.do_kv_cache_update(attn, k, v, attn.kv_cache, slot_mapping)
    out = torch.empty(q.shape[0], attn.num_heads * attn.head_size_v, dtype=q.dtype,
                      device=q.device)
    attn.impl.forward(attn, q.reshape(-1, attn.num_heads, attn.head_size), k, v,
                      attn.kv_cache, metadata,
                      output=out.view(-1, attn.num_heads, attn.head_size_v))
    return out


def forward_query_rows(layer_name: str) -> torch.Tensor | None:
    """The token rows that get a query row in the current vLLM forward (None: all rows)."""
    return getattr(layer_metadata(layer_name), "query_rows", None)


def forward_stream_positions(layer_name: str, positions: torch.Tensor):
    """For vLLM's forward: (query rows or None (all), content positions, query positions).
    Rows are those of :func:`forward_query_rows`; each query sits at the row's next position;
    infill requests' rows read their position tables (:func:`forward_true_positions`)."""
    rows = forward_query_rows(layer_name)
    query_positions = positions + 1 if rows is None else positions[rows] + 1
    true = forward_true_positions(layer_name)
    if true is not None:
        positions = positions.clone()
        positions[: true[0].numel()] = true[0]
        query_positions = true[1]
    return rows, positions, query_positions


def forward_true_positions(layer_name: str):
    """(content positions [num_actual_tokens], query positions [Rq]) of the current vLLM
    forward when it holds infill requests, else None (positions are sequence indices)."""
    md = layer_metadata(layer_name)
    if getattr(md, "positions", None) is None:
        return None
    return md.positions, md.query_positions


def apply_runner_patches() -> None:
    """Install the two runner patches this builder reads (called by the AS-ARM model
    classes in the worker): prompt ends and infill requests' true positions."""
    from vllm_anyorder import patches

    patches.apply("asarm_prompt_lens", prompt_lens=PROMPT_LENS)
    patches.apply("asarm_infill_positions", position_tables=asarm_positions.POSITION_TABLES,
                  batch_tables=asarm_positions.batch_tables)
