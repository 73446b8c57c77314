"""The dLLM row plans (``attention_backends/dllm_plans.py``): which cache blocks a node reads,
where its rows are written, and how its rows are grouped per block -- checked on a fake paged
cache whose blocks hold their own ids, with the metadata builder stubbed out."""

import pytest
import torch

pytest.importorskip("vllm")

from vllm_anyorder.attention_backends import dllm_plans  # noqa: E402


class _Builder:
    def build(self, common_prefix_len, cm, fast_build=False):
        return cm


@pytest.fixture(autouse=True)
def _plain_metadata(monkeypatch):
    monkeypatch.setattr(dllm_plans, "build_metadata",
                        lambda b, q, s, t, slots, causal: dict(q=q, s=s, table=t, causal=causal))


def _cache(num_blocks=12, bs=4):
    c = torch.arange(num_blocks, dtype=torch.float32)[:, None, None, None]
    return c.expand(num_blocks, 1, bs, 2).clone()


def test_nodes_get_private_tails_and_shared_prefix_copies():
    bs, cache = 4, _cache()
    blocks = torch.tensor([7, 3, 9, 5, 0, 0])  # the request's physical blocks
    # prefix 10 rows (2 full blocks + 2 rows of block 9), window rows [10, 16) in two groups
    job = dllm_plans.NodeJob(blocks, 10, 16, nodes=2, cuts=(12, 16))
    plan = dllm_plans.scratch_plan(_Builder(), [job], [cache], bs)
    scratch = plan.caches[0]
    md = plan.metadata
    # scratch: [copy of 7, copy of 3] shared, then per node: [copy of 9, fresh, ...]
    assert scratch[0].eq(7).all() and scratch[1].eq(3).all()
    tables = md["table"]
    assert tables.shape[0] == 4  # 2 nodes x 2 groups, each group a row of its node's table
    t0, t1 = tables[0].tolist(), tables[2].tolist()
    assert t0[:2] == t1[:2] == [0, 1] and t0[2] != t1[2]
    assert scratch[t0[2]].eq(9).all() and scratch[t1[2]].eq(9).all()
    assert scratch[t0[3]].eq(0).all()  # fresh blocks are zeros (never garbage)
    assert md["q"] == [2, 4, 2, 4] and md["s"] == [12, 16, 12, 16] and md["causal"] is False
    slots = plan.slots.tolist()
    assert slots[:6] == [t0[2] * bs + 2, t0[2] * bs + 3] + [t0[3] * bs + j for j in range(4)]
    assert slots[6:8] == [t1[2] * bs + 2, t1[2] * bs + 3]


def test_block_aligned_prefix_copies_nothing_for_the_tail():
    bs, cache = 4, _cache()
    job = dllm_plans.NodeJob(torch.tensor([2, 6, 1]), 8, 12, nodes=1, cuts=(12,))
    plan = dllm_plans.scratch_plan(_Builder(), [job], [cache], bs)
    assert plan.caches[0].shape[0] == 3
    assert plan.caches[0][0].eq(2).all() and plan.caches[0][1].eq(6).all()
    assert plan.caches[0][2].eq(0).all()
    assert plan.slots.tolist() == [8, 9, 10, 11]


def test_repair_rows_go_to_the_real_slots_in_prompt_and_block_groups():
    job = dllm_plans.NodeJob(torch.tensor([4, 2, 8]), 0, 10, nodes=1, cuts=(3, 7, 10))
    plan = dllm_plans.repair_plan(_Builder(), [job], 4)
    assert plan.caches is None
    assert plan.slots.tolist() == [16, 17, 18, 19, 8, 9, 10, 11, 32, 33]
    assert plan.metadata["q"] == [3, 4, 3] and plan.metadata["s"] == [3, 7, 10]


def test_torch_node_plan_reads_the_prefix_in_place_and_writes_nothing():
    """``dllm_torch.node_plan``: one row group per node over the request's own block-table
    row, prefix [0, start) from the cache, its rows from the forward, block-causal cuts; and
    the attention it gives equals the scratch-copy plan's rule on a dense reference."""
    from vllm_anyorder.attention_backends import dllm_torch
    from vllm_anyorder.attention_backends.paged_torch import (
        cache_shape, group_mask, paged_attention, write_kv,
    )

    bs, heads, d = 4, 2, 8
    blocks = torch.tensor([7, 3, 9, 5])
    jobs = [dllm_plans.NodeJob(blocks, 10, 16, nodes=2, cuts=(12, 16)),
            dllm_plans.NodeJob(torch.tensor([1, 2]), 3, 6, nodes=1, cuts=(5, 6))]
    plan = dllm_torch.node_plan(jobs, torch.device("cpu"))
    assert plan.caches is None and plan.slots.tolist() == [-1] * 15  # nothing written
    groups = plan.metadata.groups
    assert [(g.block_row, g.first, g.rows, g.seq_len, g.cached, g.block_ends) for g in groups] \
        == [(0, 0, 6, 16, 10, (12, 16)), (0, 6, 6, 16, 10, (12, 16)), (1, 12, 3, 6, 3, (5, 6))]
    assert plan.metadata.block_table[0].tolist() == [7, 3, 9, 5]
    assert group_mask(groups[0]).tolist()[0] == [True] * 12 + [False] * 4  # row 10: block end 12

    gen = torch.Generator().manual_seed(0)
    cache = torch.zeros(cache_shape(10, bs, heads, d))
    prefix = [torch.randn(10, heads, d, generator=gen) for _ in range(2)]
    write_kv(cache, *prefix, (blocks[torch.arange(10) // bs] * bs + torch.arange(10) % bs))
    q, k, v = (torch.randn(15, heads, d, generator=gen) for _ in range(3))
    out = paged_attention(q, cache, plan.metadata.block_table, groups, d ** -0.5,
                          k_rows=k, v_rows=v)
    for node in (0, 1):  # dense: keys = prefix + the node's own rows, block-causal
        rows = slice(6 * node, 6 * node + 6)
        keys = torch.cat([prefix[0], k[rows]]), torch.cat([prefix[1], v[rows]])
        s = torch.einsum("rhd,shd->hrs", q[rows], keys[0]) * d ** -0.5
        s = s.masked_fill(~group_mask(groups[node])[None], float("-inf"))
        want = torch.einsum("hrs,shd->rhd", s.softmax(-1), keys[1])
        assert torch.allclose(out[rows], want, atol=1e-5)
