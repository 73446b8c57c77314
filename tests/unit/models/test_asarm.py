"""AS-ARM model formats: checkpoint round trips, Llama-shaped weights, two-stream masks."""

import json

import pytest
import torch
from safetensors.torch import load_file

from vllm_anyorder.model_executor.asarm import (
    AsArmConfig, load, random_asarm,
)
from vllm_anyorder.model_executor.xlnet_asarm import XLNetAsArm, random_xlnet

T = torch.tensor
CONFIG = AsArmConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8)


@pytest.fixture(scope="module")
def llama_asarm():
    return random_asarm(CONFIG, seed=3, std=0.3)


@pytest.fixture(scope="module")
def xlnet_asarm():
    return random_xlnet(40, seed=1, std=0.3)


@pytest.fixture(params=["llama", "xlnet"])
def asarm(request, llama_asarm, xlnet_asarm):
    return llama_asarm if request.param == "llama" else xlnet_asarm


# a sequence of 8 positions: visible at 0, 1, 5; generated 3 (rank 1), 2 (rank 2), 6 (rank 3)
TOKENS, POSITIONS, ORDER = T([7, 8, 9, 10, 11, 12]), T([0, 1, 5, 3, 2, 6]), T([0, 0, 0, 1, 2, 3])


def query(model, tokens=TOKENS, positions=POSITIONS, order=ORDER, queries=(3, 2, 6, 4, 7)):
    return model.content_and_query(tokens, positions, order, T(list(queries)))


def test_llama_checkpoint_round_trip_uses_llama_names(tmp_path, llama_asarm):
    llama_asarm.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "anyorder_llama"
    assert cfg["architectures"] == ["AnySubsetLlamaForCausalLM"]
    assert cfg["query_init"] == "learned" and cfg["num_key_value_heads"] == 2
    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert {"model.embed_tokens.weight", "model.query_embed", "model.norm.weight",
            "lm_head.weight", "model.layers.1.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight", "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.post_attention_layernorm.weight"} <= names
    again = load(tmp_path)
    assert again.config == llama_asarm.config
    assert torch.equal(query(again), query(llama_asarm))


def test_tied_embeddings_round_trip(tmp_path):
    cfg = AsArmConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                      head_dim=8, tie_word_embeddings=True)
    model = random_asarm(cfg, seed=0)
    model.save_pretrained(tmp_path)
    assert "lm_head.weight" not in load_file(str(tmp_path / "model.safetensors"))
    assert torch.equal(query(load(tmp_path), queries=(4,)), query(model, queries=(4,)))


def test_bad_configs_are_refused(tmp_path, llama_asarm):
    llama_asarm.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    for bad in ({"model_type": "llama"}, {"query_init": "mask_token"}, {"hidden_act": "gelu"}):
        (tmp_path / "config.json").write_text(json.dumps({**cfg, **bad}))
        with pytest.raises(ValueError):
            load(tmp_path)


def test_xlnet_checkpoint_round_trip(tmp_path, xlnet_asarm):
    xlnet_asarm.save_pretrained(tmp_path)
    again = XLNetAsArm.from_pretrained(tmp_path)
    assert torch.allclose(query(again), query(xlnet_asarm), atol=1e-5)


def test_content_stream_is_a_llama_decoder(llama_asarm):
    """Left-to-right order = plain causal attention: the content stream's logits equal
    transformers' LlamaForCausalLM loaded from the same tensors (the weights are Llama's)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = llama_asarm.config
    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, tie_word_embeddings=False))
    state = {k: v for k, v in llama_asarm.state_dict().items() if k != "model.query_embed"}
    hf.load_state_dict(state, strict=True)
    tokens = T([3, 9, 27, 1, 14, 5])
    want = hf.eval()(tokens[None]).logits[0]
    # one visible token, then every later token generated in position order
    h, _ = llama_asarm.streams(tokens, torch.arange(6), torch.arange(6), T([6]))
    assert torch.allclose(llama_asarm.lm_head(h), want, atol=1e-4)


def test_a_query_ignores_its_own_token_and_everything_decoded_after_it(asarm):
    base = query(asarm)
    # position 2 (rank 2): change its own token and the rank-3 token at 6
    changed = query(asarm, tokens=T([7, 8, 9, 10, 30, 31]))
    assert torch.allclose(changed[:2], base[:2], atol=1e-5)  # queries at 3 (rank 1), 2
    assert not torch.allclose(changed[2:], base[2:], atol=1e-3)  # 6 and empty ones see them
    # the rank-1 token changes: every later query moves, the rank-1 query does not
    changed = query(asarm, tokens=T([7, 8, 9, 33, 11, 12]))
    assert torch.allclose(changed[0], base[0], atol=1e-5)
    assert not torch.allclose(changed[1], base[1], atol=1e-3)


def test_visible_tokens_see_each_other_and_are_seen_by_every_query(asarm):
    base = query(asarm)
    changed = query(asarm, tokens=T([7, 8, 20, 10, 11, 12]))  # visible token at 5
    assert all(not torch.allclose(changed[i], base[i], atol=1e-3) for i in range(5))


def test_parallel_queries_do_not_interact_and_row_order_is_irrelevant(asarm):
    base = query(asarm)
    assert torch.allclose(query(asarm, queries=(4,))[0], base[3], atol=1e-5)
    assert torch.allclose(query(asarm, queries=(7, 3)), base[[4, 0]], atol=1e-5)
    perm = T([4, 0, 5, 2, 1, 3])
    shuffled = query(asarm, tokens=TOKENS[perm], positions=POSITIONS[perm], order=ORDER[perm])
    assert torch.allclose(shuffled, base, atol=1e-5)


def test_positions_are_true_positions(asarm):
    base = query(asarm, queries=(4,))
    moved = query(asarm, positions=T([0, 1, 5, 3, 2, 7]), queries=(4,))  # rank-3 token 6 -> 7
    assert not torch.allclose(moved, base, atol=1e-3)


def test_invalid_inputs_are_refused(asarm):
    with pytest.raises(ValueError):
        query(asarm, queries=(1,))  # visible position
    with pytest.raises(ValueError):
        query(asarm, positions=T([0, 1, 5, 3, 3, 6]))  # two tokens at one position
    with pytest.raises(ValueError):
        query(asarm, order=T([0, 0, 0, 1, 1, 3]))  # generated ranks must be distinct


def test_gqa_and_empty_context(llama_asarm):
    out = llama_asarm.content_and_query(T([], dtype=torch.long), T([], dtype=torch.long),
                                        T([], dtype=torch.long), T([0, 1]))
    assert out.shape == (2, 40) and torch.isfinite(out).all()


def test_auto_config_reads_the_checkpoint(tmp_path, llama_asarm):
    from transformers import AutoConfig

    from vllm_anyorder.model_executor.hf_configs import register

    # the one registration (a module-level class: engines pickle the config to their worker
    # processes; a class defined in a function, as a second copy of this once was, cannot be)
    register()
    register()  # idempotent
    llama_asarm.save_pretrained(tmp_path)
    cfg = AutoConfig.from_pretrained(tmp_path)
    assert cfg.model_type == "anyorder_llama" and cfg.num_key_value_heads == 2
    assert cfg.query_init == "learned"
