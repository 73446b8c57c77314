"""The device-agnostic paged attention (attention_backends/paged_torch.py) against a dense
float64 reference, for every mask the plugin uses: causal, bidirectional, AS-ARM prompt +
causal, query rows that read a prefix without writing, dLLM block-causal, node canvases over
a shared prefix, XLNet-style additive scores; GQA, split groups, more rows than keys, -1
slots, scattered blocks; fp32 / bf16 / fp16. Runs on CPU here; on a GPU machine (plain
PyTorch, no vLLM needed):
``ANYORDER_TEST_DEVICE=cuda python -m pytest tests/unit/adapters/test_paged_torch.py``."""

import os

import pytest
import torch

from vllm_anyorder.attention_backends.paged_torch import (
    RowGroup, cache_shape, group_mask, paged_attention, write_kv,
)

BS, KV_HEADS, HEADS, D = 4, 2, 4, 16  # GQA: 2 query heads per kv head
DEVICE = torch.device(os.environ.get("ANYORDER_TEST_DEVICE", "cpu"))
TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}


def reference(q, k, v, allowed, bias=None):
    """Dense attention in float64: q [R, H, D], k/v [S, Hkv, D], allowed [R, S] bool."""
    g = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = torch.einsum("rhd,shd->hrs", q.double(), k) / D ** 0.5
    if bias is not None:
        s = s + bias.double()
    out = torch.zeros(q.shape, dtype=torch.float64)
    for r in range(q.shape[0]):
        if allowed[r].any():
            p = torch.softmax(s[:, r].masked_fill(~allowed[r], float("-inf")), -1)
            out[r] = torch.einsum("hs,shd->hd", p, v)
    return out


def setup(seq_lens, dtype=torch.float32, seed=0, scatter=True):
    """A cache with each request's K/V written at scattered blocks; returns the cache, the
    block table and per-request dense K/V."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-s // BS) for s in seq_lens]
    order = torch.randperm(sum(need) + 3, generator=gen) if scatter else torch.arange(sum(need) + 3)
    cache = torch.zeros(cache_shape(sum(need) + 3, BS, KV_HEADS, D), dtype=dtype, device=DEVICE)
    table = torch.full((len(seq_lens), max(need)), -1, dtype=torch.int32, device=DEVICE)
    dense, start = [], 0
    for i, (s, n) in enumerate(zip(seq_lens, need)):
        table[i, :n] = order[start: start + n].to(torch.int32)
        start += n
        k = torch.randn(s, KV_HEADS, D, generator=gen).to(dtype)
        v = torch.randn(s, KV_HEADS, D, generator=gen).to(dtype)
        j = torch.arange(s)
        slots = table[i, j // BS].long() * BS + j % BS
        write_kv(cache, k.to(DEVICE), v.to(DEVICE), slots)
        dense.append((k, v))
    return cache, table, dense


def run(groups, seq_lens, dtype=torch.float32, bias=None):
    cache, table, dense = setup(seq_lens, dtype)
    total = sum(g.rows for g in groups)
    q = torch.randn(total, HEADS, D, generator=torch.Generator().manual_seed(1)).to(dtype)
    out = paged_attention(q.to(DEVICE), cache, table, groups, D ** -0.5,
                          (lambda g, slots: bias[g.block_row].to(DEVICE)) if bias else None)
    out = out.cpu()
    for g in groups:
        k, v = dense[g.block_row]
        rows = slice(g.first, g.first + g.rows)
        want = reference(q[rows], k[: g.seq_len], v[: g.seq_len], group_mask(g),
                         bias[g.block_row] if bias else None)
        assert torch.allclose(out[rows].double(), want, atol=TOL[dtype], rtol=TOL[dtype]), g
    return out, q


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_causal_decode_and_verify_rows_with_gqa(dtype):
    # request 0: 9 rows verifying at the end of 13 tokens; request 1: one decode row of 6
    run([RowGroup(0, 0, 9, 13), RowGroup(1, 9, 1, 6)], [13, 6], dtype)


def test_masks_match_their_rules():
    causal = group_mask(RowGroup(0, 0, 3, 5))
    assert causal.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    prompt = group_mask(RowGroup(0, 0, 5, 5, prompt_len=3))
    assert prompt.tolist()[:3] == [[1, 1, 1, 0, 0]] * 3  # the prompt sees the prompt
    assert prompt.tolist()[3:] == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]  # then causal
    blocks = group_mask(RowGroup(0, 0, 6, 6, block_ends=(2, 4, 6)))
    assert blocks.tolist() == [[1, 1, 0, 0, 0, 0]] * 2 + [[1, 1, 1, 1, 0, 0]] * 2 + \
        [[1] * 6] * 2
    assert group_mask(RowGroup(0, 0, 7, 3, causal=False)).all()  # more rows than keys


def test_asarm_prompt_then_causal_and_split_groups():
    # one request split in two groups over the same block-table row: its bidirectional prompt
    # (5 rows), then 3 causal rows (vLLM's padded [token, -1 x k] schedule does this)
    groups = [RowGroup(0, 0, 5, 5, causal=False), RowGroup(0, 5, 3, 8, prompt_len=5),
              RowGroup(1, 8, 6, 6, prompt_len=6)]
    run(groups, [8, 6])


def test_query_rows_read_a_prefix_without_writing():
    # ASSD drafting queries: 5 rows (more than the 3 keys) each see exactly the prefix
    run([RowGroup(0, 0, 5, 3, causal=False), RowGroup(1, 5, 2, 9, causal=False)], [3, 9])


def test_dllm_block_causal_and_node_canvases_over_a_shared_prefix():
    # two nodes of one request: each is a canvas of the same 4 window rows over a committed
    # prefix of 8, written at their own positions (rows 8..11), block ends every 4 tokens
    pos = torch.arange(8, 12)
    nodes = [RowGroup(0, 0, 4, 12, block_ends=(4, 8, 12), positions=pos),
             RowGroup(1, 4, 4, 12, block_ends=(4, 8, 12), positions=pos)]
    run(nodes, [12, 12])
    # a repair forward rewriting the prompt (bidirectional, 5) and one block of 4 after it
    run([RowGroup(0, 0, 9, 9, block_ends=(5, 9))], [9])


def test_node_canvases_read_the_prefix_from_the_cache_and_their_own_rows_unwritten():
    # one request, prefix of 8 committed tokens in the cache; 3 candidate canvases (nodes) of
    # the next block (4 rows at positions 8..11) each attend to the prefix + their own rows
    cache, table, dense = setup([8])
    gen = torch.Generator().manual_seed(5)
    nodes, rows = 3, 4
    q = torch.randn(nodes * rows, HEADS, D, generator=gen)
    k_new = torch.randn(nodes * rows, KV_HEADS, D, generator=gen)
    v_new = torch.randn(nodes * rows, KV_HEADS, D, generator=gen)
    before = cache.clone()
    groups = [RowGroup(0, n * rows, rows, 8 + rows, block_ends=(4, 8, 12),
                       positions=torch.arange(8, 12), cached=8) for n in range(nodes)]
    out = paged_attention(q.to(DEVICE), cache, table, groups, D ** -0.5,
                          k_rows=k_new.to(DEVICE), v_rows=v_new.to(DEVICE)).cpu()
    assert torch.equal(cache, before)  # nothing written
    k, v = dense[0]
    for g in groups:
        r = slice(g.first, g.first + rows)
        want = reference(q[r], torch.cat([k, k_new[r]]), torch.cat([v, v_new[r]]),
                         group_mask(g))
        assert torch.allclose(out[r].double(), want, atol=1e-5)


def test_additive_scores_xlnet_style():
    gen = torch.Generator().manual_seed(3)
    bias = {0: torch.randn(HEADS, 4, 10, generator=gen), 1: torch.randn(HEADS, 2, 3, generator=gen)}
    run([RowGroup(0, 0, 4, 10), RowGroup(1, 4, 2, 3, causal=False)], [10, 3], bias=bias)


def test_padding_slots_are_never_written_and_rows_without_keys_are_zero():
    cache = torch.zeros(cache_shape(4, BS, KV_HEADS, D), device=DEVICE)
    k = torch.ones(3, KV_HEADS, D, device=DEVICE)
    write_kv(cache, k, 2 * k, torch.tensor([5, -1, 6], device=DEVICE))
    written = (cache.transpose(1, 2).reshape(-1, KV_HEADS * 2 * D) != 0).any(-1).nonzero().flatten()
    assert written.tolist() == [5, 6]
    q = torch.randn(2, HEADS, D, device=DEVICE)
    table = torch.tensor([[1, 0, 2, 3]], dtype=torch.int32, device=DEVICE)
    out = paged_attention(q, cache, table, [RowGroup(0, 0, 1, 0)], 1.0)  # no keys: skipped
    assert not out.any()
    out = paged_attention(q, cache, table, [RowGroup(0, 1, 1, 7, causal=False)], 1.0)
    assert not out[0].any() and out[1].abs().sum() > 0  # row 0 in no group: zeros


def test_batches_of_groups_within_the_budget_give_the_same_rows(monkeypatch):
    """Groups are padded into batches (one SDPA each) within BATCH_BUDGET: a budget small
    enough to force one group per batch gives the same output; prepared batches are reused."""
    from vllm_anyorder.attention_backends import paged_torch

    groups = [RowGroup(0, 0, 4, 10), RowGroup(1, 4, 3, 3, causal=False),
              RowGroup(2, 7, 2, 6, block_ends=(4, 6), positions=torch.tensor([4, 5]))]
    cache, table, _ = setup([10, 3, 6])
    q = torch.randn(9, HEADS, D, device=DEVICE)
    whole = paged_attention(q, cache, table, groups, D ** -0.5)
    assert len(paged_torch.prepare(groups, table, BS)) == 1
    monkeypatch.setattr(paged_torch, "BATCH_BUDGET", 1)
    prepared = paged_torch.prepare(groups, table, BS)
    assert [len(p.groups) for p in prepared] == [1, 1, 1]
    split = paged_attention(q, cache, table, groups, D ** -0.5, prepared=prepared)
    assert torch.allclose(whole, split, atol=1e-6)
