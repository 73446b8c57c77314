"""XLNet relative attention over a paged cache (``attention_backends/xlnet_relative.py``)
against transformers' own ``XLNetRelativeAttention.rel_attn_core`` (dense, positions
0..S-1): keys scattered over non-contiguous blocks, per-group causal flags (a prompt part
attending bidirectionally, a causal part of the same request), query rows that only read,
and ``clamp_len``."""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")
transformers = pytest.importorskip("transformers")

D_MODEL, H, D, BS = 32, 2, 16, 4


def _hf_layer(clamp_len: int):
    from transformers import XLNetConfig
    from transformers.models.xlnet.modeling_xlnet import XLNetModel, XLNetRelativeAttention

    cfg = XLNetConfig(vocab_size=8, d_model=D_MODEL, n_layer=1, n_head=H, d_head=D,
                      d_inner=16, clamp_len=clamp_len, dropout=0.0)
    torch.manual_seed(0)
    layer = XLNetRelativeAttention(cfg).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.5)
    model = XLNetModel(cfg)
    return layer, lambda n: model.relative_positional_encoding(n, n, bsz=1)


def _dense(layer, pos_emb, q, k, v, allowed):
    """HF's scores for queries at positions 0..S-1 over keys 0..S-1; allowed [S, S]."""
    s = k.shape[0]
    k_r = torch.einsum("ibh,hnd->ibnd", pos_emb(s).to(q.dtype), layer.r)
    mask = (~allowed).float()[:, :, None, None]  # [i, j, b, n] 1 = masked
    out = layer.rel_attn_core(q[:, None], k[:, None], v[:, None], k_r, attn_mask=mask)
    return out[:, 0]


@pytest.mark.parametrize("clamp_len", [-1, 3])
def test_paged_relative_attention_equals_xlnet(clamp_len):
    from vllm_anyorder.attention_backends import xlnet_relative as rel
    from vllm_anyorder.attention_backends.paged_torch import RowGroup, write_kv

    layer, pos_emb = _hf_layer(clamp_len)
    torch.manual_seed(1)
    s, prompt = 11, 6  # one request: 6 prompt tokens (bidirectional), 5 generated (causal)
    q, k, v = (torch.randn(s, H, D) for _ in range(3))
    # keys live in blocks 7, 2, 5 (non-contiguous), written through the slot table
    block_row = torch.tensor([[7, 2, 5, 0]])
    slots = torch.tensor([int(block_row[0, j // BS]) * BS + j % BS for j in range(s)])
    cache = torch.zeros(8, H, BS, 2 * D)
    write_kv(cache, k, v, slots)
    keys = rel.SlotPositions()
    keys.write(slots, torch.arange(s))
    scoring = rel.RelativeScoring(layer.r_w_bias.float(), layer.r_r_bias.float(),
                                  rel.relative_key_table(layer.r.data, 20, clamp_len), 20,
                                  D ** -0.5)
    # the AS-ARM builder's layout: the prompt rows as a bidirectional group, the rest causal
    metadata = SimpleNamespace(
        groups=[RowGroup(0, 0, prompt, prompt, causal=False), RowGroup(1, prompt, s - prompt, s)],
        block_table=block_row.repeat(2, 1))
    got = rel.paged_relative_attention(q, torch.arange(s), cache, metadata, keys, scoring)
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    allowed = ((i < prompt) & (j < prompt)) | ((i >= prompt) & (j <= i))
    want = _dense(layer, pos_emb, q, k, v, allowed)
    assert torch.allclose(got, want, atol=1e-5), float((got - want).abs().max())

    # query rows (read only): row r predicts position prompt + r and sees keys [0, prompt + r)
    g = torch.randn(4, H, D)
    prefix = SimpleNamespace(groups=[RowGroup(0, 0, 4, prompt + 4)], block_table=block_row)
    got_q = rel.paged_relative_attention(g, torch.arange(prompt, prompt + 4) + 1, cache,
                                         prefix, keys, scoring)
    q_full = torch.zeros(s, H, D)
    q_full[prompt + 1: prompt + 5] = g
    allowed_q = j < i  # the query stream never sees its own position
    want_q = _dense(layer, pos_emb, q_full, k, v, allowed_q)[prompt + 1: prompt + 5]
    assert torch.allclose(got_q, want_q, atol=1e-5), float((got_q - want_q).abs().max())
    assert torch.equal(cache.abs().sum((1, 3)) > 0,
                       torch.zeros(8, BS, dtype=torch.bool).index_put_(
                           (slots // BS, slots % BS), torch.tensor(True)))  # nothing else written


def test_profiling_run_and_padding_slots():
    from vllm_anyorder.attention_backends import xlnet_relative as rel
    from vllm_anyorder.attention_backends.paged_torch import write_kv

    cache = torch.zeros(2, H, BS, 2 * D)
    write_kv(cache, torch.ones(3, H, D), torch.ones(3, H, D), torch.tensor([-1, 1, -1]))
    assert int((cache.abs().sum((1, 3)) > 0).sum()) == 1
    keys = rel.SlotPositions()
    keys.write(torch.tensor([-1, 5]), torch.tensor([9, 4]))
    assert int(keys.read(torch.tensor([5]))) == 4
    scoring = rel.RelativeScoring(torch.zeros(H, D), torch.zeros(H, D),
                                  torch.zeros(5, H, D), 2, 1.0)
    out = rel.paged_relative_attention(torch.ones(3, H, D), torch.arange(3), cache, None,
                                       keys, scoring)
    assert torch.equal(out, torch.zeros(3, H, D))
