"""What the AS-ARM glue relies on from vLLM's stock CPU attention op (checked against dense
attention): prefix-only query rows (causal off, any number of rows over ``seq_len`` keys,
nothing written) and per-request causal flags, also for two row groups of one request that
share a block-table row (how a request crossing the prompt end is split)."""

import random

import pytest
import torch

ops = pytest.importorskip("vllm._custom_ops")

H, KVH, D, BS = 2, 1, 32, 128


@pytest.fixture(scope="module")
def isa():
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    return _get_attn_isa(torch.float32, BS, D)


def _dense(q, k, v, causal_ctx=None):
    """q [Q, H, D] over k/v [S, KVH, D]; causal_ctx: row j sees keys [0, causal_ctx + j]."""
    k, v = k.repeat_interleave(H // KVH, 1), v.repeat_interleave(H // KVH, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * D ** -0.5
    if causal_ctx is not None:
        allowed = torch.arange(k.shape[0])[None] <= causal_ctx + torch.arange(q.shape[0])[:, None]
        scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v)


def _run(isa, groups, causal):
    """groups: (keys k, v, query rows, block row); one request per group."""
    cache = torch.zeros(16, KVH, BS * 2, D)
    kc, vc = cache.chunk(2, dim=2)
    table = torch.tensor([[2 * g[3], 2 * g[3] + 1] for g in groups], dtype=torch.int32)
    for (k, v, _, row), blocks in zip(groups, table):
        slots = torch.tensor([int(blocks[j // BS]) * BS + j % BS for j in range(k.shape[0])])
        ops.cpu_attn_reshape_and_cache(k, v, kc, vc, slots, isa)
    q = torch.cat([g[2] for g in groups])
    qsl = torch.tensor([0] + torch.cumsum(torch.tensor([g[2].shape[0] for g in groups]), 0).tolist(),
                       dtype=torch.int32)
    sl = torch.tensor([g[0].shape[0] for g in groups], dtype=torch.int32)
    dyn = causal if isinstance(causal, torch.Tensor) else None
    flag = False if dyn is not None else causal
    md = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=len(groups), num_heads=H, num_kv_heads=KVH, head_dim=D, seq_lens=sl,
        dtype=torch.float32, query_start_loc=qsl, causal=flag, sliding_window_size=-1,
        isa=isa, enable_kv_split=True, dynamic_causal=dyn)
    out = torch.empty_like(q)
    ops.cpu_attention_with_kv_cache(
        query=q, key_cache=kc, value_cache=vc, output=out, query_start_loc=qsl, seq_lens=sl,
        scale=D ** -0.5, causal=flag, alibi_slopes=None, sliding_window=-1, block_table=table,
        softcap=0, scheduler_metadata=md, s_aux=None, dynamic_causal=dyn)
    return [out[qsl[i]: qsl[i + 1]] for i in range(len(groups))]


def test_prefix_only_query_rows(isa):
    rng = random.Random(0)
    torch.manual_seed(0)
    for _ in range(40):
        groups = []
        for row in range(rng.randint(1, 4)):
            s, nq = rng.randint(1, 200), rng.randint(1, 9)  # also more rows than keys
            groups.append((torch.randn(s, KVH, D), torch.randn(s, KVH, D),
                           torch.randn(nq, H, D), row))
        for (k, v, q, _), out in zip(groups, _run(isa, groups, causal=False)):
            assert torch.allclose(out, _dense(q, k, v), atol=1e-5)


def test_per_request_causal_flags_and_split_requests(isa):
    torch.manual_seed(1)
    k, v = torch.randn(9, KVH, D), torch.randn(9, KVH, D)  # prompt 4 + 5 later tokens
    q = torch.randn(9, H, D)
    # one request split in two groups over the same block row: rows 0-3 see the prompt
    # (keys 0-3) bidirectionally, rows 4-8 causally; plus an ordinary causal request
    k2, v2, q2 = torch.randn(7, KVH, D), torch.randn(7, KVH, D), torch.randn(3, H, D)
    groups = [(k[:4], v[:4], q[:4], 0), (k, v, q[4:], 0), (k2, v2, q2, 1)]
    out = _run(isa, groups, causal=torch.tensor([0, 1, 1], dtype=torch.int32))
    assert torch.allclose(out[0], _dense(q[:4], k[:4], v[:4]), atol=1e-5)
    assert torch.allclose(out[1], _dense(q[4:], k, v, causal_ctx=4), atol=1e-5)
    assert torch.allclose(out[2], _dense(q2, k2, v2, causal_ctx=4), atol=1e-5)
