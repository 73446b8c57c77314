"""LLaDA and Dream model classes: the released checkpoint layouts, save/load round trips,
logits against an independently written plain forward and against transformers' Llama/Qwen2
run bidirectionally, KV-prefix continuation, masks, Dream's logit shift."""

import json
import math

import pytest
import torch

from vllm_anyorder.model_executor.dream import DreamConfig, DreamModel, random_dream
from vllm_anyorder.model_executor.llada import LLaDAConfig, LLaDAModel, random_llada

# config.json keys of GSAI-ML/LLaDA-8B-Instruct (46; the HF file is 54 lines, keys sorted)
LLADA_KEYS = {
    "activation_type", "alibi", "alibi_bias_max", "architectures", "attention_dropout",
    "attention_layer_norm", "attention_layer_norm_with_affine", "auto_map",
    "bias_for_layer_norm", "block_group_size", "block_type", "d_model", "embedding_dropout",
    "embedding_size", "eos_token_id", "flash_attention", "include_bias", "include_qkv_bias",
    "init_cutoff_factor", "init_device", "init_fn", "init_std", "input_emb_norm",
    "layer_norm_type", "layer_norm_with_affine", "mask_token_id", "max_sequence_length",
    "mlp_hidden_size", "mlp_ratio", "model_type", "multi_query_attention", "n_heads",
    "n_kv_heads", "n_layers", "pad_token_id", "precision", "residual_dropout", "rms_norm_eps",
    "rope", "rope_full_precision", "rope_theta", "scale_logits", "use_cache", "vocab_size",
    "weight_tying",
}  # + "transformers_version", whose released value was not confirmed (not written)
# config.json keys of Dream-org/Dream-v0-Instruct-7B, less "_name_or_path"
DREAM_KEYS = {
    "architectures", "attention_dropout", "auto_map", "bos_token_id", "eos_token_id",
    "hidden_act", "hidden_size", "initializer_range", "intermediate_size", "mask_token_id",
    "max_position_embeddings", "max_window_layers", "model_type", "num_attention_heads",
    "num_hidden_layers", "num_key_value_heads", "pad_token_id", "rms_norm_eps", "rope_scaling",
    "rope_theta", "sliding_window", "tie_word_embeddings", "torch_dtype", "transformers_version",
    "use_cache", "use_mrope", "use_sliding_window", "vocab_size",
}
LLADA_LAYER = ["attn_norm", "ff_norm", "q_proj", "k_proj", "v_proj", "attn_out", "ff_proj",
               "up_proj", "ff_out"]
DREAM_LAYER = ["self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
               "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias",
               "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
               "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"]


def llada_config(**kw):
    base = dict(d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, mlp_hidden_size=48,
                vocab_size=60, embedding_size=64, mask_token_id=63, eos_token_id=1,
                pad_token_id=1)
    return LLaDAConfig(**{**base, **kw})


def dream_config(**kw):
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, mask_token_id=63, eos_token_id=1,
                bos_token_id=1, pad_token_id=1)
    return DreamConfig(**{**base, **kw})


# ------------------------------------------------------------------------ plain forward
def plain_forward(sd, arch, cfg, tokens, positions):
    """Token by token, head by head, rotary as complex rotation of (x_j, x_{j+D/2})."""
    if arch == "llada":
        pre, n_layers, heads, kv_heads = "model.transformer.", cfg.n_layers, cfg.n_heads, cfg.kv_heads
        eps, theta = cfg.rms_norm_eps, cfg.rope_theta
        names = {"emb": pre + "wte.weight", "final": pre + "ln_f.weight",
                 "head": pre + ("wte.weight" if cfg.weight_tying else "ff_out.weight")}
        lay = {k: f"{pre}blocks.{{}}.{v}" for k, v in dict(
            n1="attn_norm.weight", n2="ff_norm.weight", q="q_proj", k="k_proj", v="v_proj",
            o="attn_out.weight", g="ff_proj.weight", u="up_proj.weight",
            d="ff_out.weight").items()}
    else:
        n_layers, heads, kv_heads = cfg.num_hidden_layers, cfg.num_attention_heads, \
            cfg.num_key_value_heads
        eps, theta = cfg.rms_norm_eps, cfg.rope_theta
        names = {"emb": "model.embed_tokens.weight", "final": "model.norm.weight",
                 "head": "lm_head.weight"}
        lay = {k: f"model.layers.{{}}.{v}" for k, v in dict(
            n1="input_layernorm.weight", n2="post_attention_layernorm.weight",
            q="self_attn.q_proj", k="self_attn.k_proj", v="self_attn.v_proj",
            o="self_attn.o_proj.weight", g="mlp.gate_proj.weight", u="mlp.up_proj.weight",
            d="mlp.down_proj.weight").items()}
    sd = {k: v.double() for k, v in sd.items()}

    def norm(x, w):
        return x / math.sqrt(float((x * x).mean()) + eps) * w

    def lin(x, name):
        w = sd[name + ".weight"] if not name.endswith("weight") else sd[name]
        b = sd.get(name + ".bias") if not name.endswith("weight") else None
        return w @ x + (b if b is not None else 0)

    def rope(x, pos):
        half = x.numel() // 2
        freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.numel())
        z = torch.complex(x[:half], x[half:]) * torch.polar(torch.ones(half, dtype=torch.float64),
                                                             pos * freq)
        return torch.cat([z.real, z.imag])

    xs = [sd[names["emb"]][t].clone() for t in tokens]
    d = xs[0].numel() // heads
    for i in range(n_layers):
        L = {k: v.format(i) for k, v in lay.items()}
        hs = [norm(x, sd[L["n1"]]) for x in xs]
        qs = [lin(h, L["q"]) for h in hs]
        ks = [lin(h, L["k"]) for h in hs]
        vs = [lin(h, L["v"]) for h in hs]
        outs = []
        for a in range(len(xs)):
            per_head = []
            for h in range(heads):
                g = h // (heads // kv_heads)
                q = rope(qs[a][h * d:(h + 1) * d], positions[a])
                sc = torch.stack([rope(ks[b][g * d:(g + 1) * d], positions[b]) @ q
                                  for b in range(len(xs))]) / math.sqrt(d)
                w = torch.exp(sc - sc.max())
                w = w / w.sum()
                per_head.append(sum(w[b] * vs[b][g * d:(g + 1) * d] for b in range(len(xs))))
            outs.append(sd[L["o"]] @ torch.cat(per_head))
        xs = [x + o for x, o in zip(xs, outs)]
        for a, x in enumerate(xs):
            h = norm(x, sd[L["n2"]])
            gate = sd[L["g"]] @ h
            xs[a] = x + sd[L["d"]] @ (gate / (1 + torch.exp(-gate)) * (sd[L["u"]] @ h))
    return torch.stack([sd[names["head"]] @ norm(x, sd[names["final"]]) for x in xs])


@pytest.mark.parametrize("arch,cfg", [
    ("llada", llada_config()), ("llada", llada_config(n_kv_heads=4, weight_tying=True)),
    ("dream", dream_config()), ("dream", dream_config(num_key_value_heads=1))])
def test_logits_match_a_plain_forward(arch, cfg):
    model = (random_llada if arch == "llada" else random_dream)(cfg, seed=3)
    tokens, positions = [5, 17, 63, 63, 2, 40], [0, 1, 2, 3, 4, 5]
    want = plain_forward(model.state_dict(), arch, cfg, tokens, positions).float()
    got, _ = model(torch.tensor([tokens]), torch.tensor([positions]), shift=False)
    assert torch.allclose(got[0], want, atol=1e-4, rtol=1e-4)
    shifted, _ = model(torch.tensor([tokens]), torch.tensor([positions]))
    if arch == "dream":  # row i predicts token i from row i-1; row 0 keeps its own
        assert torch.equal(shifted[0, 1:], got[0, :-1]) and torch.equal(shifted[0, 0], got[0, 0])
    else:
        assert torch.equal(shifted, got)


def test_matches_transformers_llama_and_qwen2_run_bidirectionally():
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    t = torch.randint(0, 60, (2, 9))
    pos = torch.arange(9).expand(2, 9)
    full = torch.zeros(2, 1, 9, 9)  # additive 4-D mask: everyone sees everyone
    dc = dream_config()
    dream = random_dream(dc, seed=1)
    qwen = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6,
        tie_word_embeddings=False, attn_implementation="eager")).eval()
    qwen.load_state_dict(dream.state_dict(), strict=True)
    lc = llada_config()
    llada = random_llada(lc, seed=1)
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=500000.0,
        tie_word_embeddings=False, attn_implementation="eager")).eval()
    rename = {"wte": "embed_tokens", "ln_f": "norm", "attn_out": "self_attn.o_proj",
              "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj",
              "v_proj": "self_attn.v_proj", "ff_proj": "mlp.gate_proj",
              "up_proj": "mlp.up_proj", "ff_out": "mlp.down_proj",
              "attn_norm": "input_layernorm", "ff_norm": "post_attention_layernorm"}
    state = {}
    for name, w in llada.state_dict().items():
        name = name.replace("model.transformer.", "model.")
        if name == "model.ff_out.weight":
            state["lm_head.weight"] = w
            continue
        parts = name.split(".")
        parts = [rename.get(p, p) for p in parts]
        state[".".join(parts).replace("blocks.", "layers.")] = w
    llama.load_state_dict(state, strict=True)
    with torch.no_grad():
        for ours, theirs in ((dream, qwen), (llada, llama)):
            want = theirs(input_ids=t, attention_mask=full, position_ids=pos).logits
            got, _ = ours(t, pos, shift=False)
            assert torch.allclose(got, want, atol=1e-4), type(ours).__name__
            causal = theirs(input_ids=t).logits  # and the mask really is bidirectional
            assert not torch.allclose(got, causal, atol=1e-2)


# ------------------------------------------------------------------------ KV prefix and masks
@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_a_kv_prefix_continues_a_block_causal_forward(arch):
    model = random_llada(llada_config(), 2) if arch == "llada" else random_dream(dream_config(), 2)
    tokens = torch.randint(0, 60, (2, 10))
    pos = torch.arange(10).expand(2, 10)
    blk = torch.tensor([-1] * 4 + [0] * 3 + [1] * 3)  # prompt of 4, blocks of 3
    mask = (blk[None, :] <= blk[:, None]).expand(2, 10, 10)
    want, kv_full = model(tokens, pos, attn_mask=mask, shift=False)
    head, kv = model(tokens[:, :7], pos[:, :7], attn_mask=mask[:, :7, :7], shift=False)
    tail, kv_tail = model(tokens[:, 7:], pos[:, 7:], past_kv=kv, shift=False)
    assert torch.allclose(head, want[:, :7], atol=1e-5)
    assert torch.allclose(tail, want[:, 7:], atol=1e-5)
    for (k, v), (kf, vf) in zip(kv_tail, kv_full):
        assert k.shape == (2, 3) + k.shape[2:] and torch.allclose(k, kf[:, 7:], atol=1e-5)
    # padding: a masked-out key changes nothing, a row that sees nothing gives finite output
    padded = torch.cat([tokens, torch.full((2, 2), 7)], 1)
    ppos = torch.cat([pos, torch.zeros(2, 2, dtype=torch.long)], 1)
    pmask = torch.zeros(2, 12, 12, dtype=torch.bool)
    pmask[:, :10, :10] = mask
    got, _ = model(padded, ppos, attn_mask=pmask, shift=False)
    assert torch.allclose(got[:, :10], want, atol=1e-5) and bool(got.isfinite().all())


# ------------------------------------------------------------------------ checkpoints
def test_llada_checkpoint_has_the_released_layout_and_round_trips(tmp_path):
    cfg = llada_config()
    model = random_llada(cfg, seed=4)
    model.save_pretrained(tmp_path / "one")
    written = json.loads((tmp_path / "one" / "config.json").read_text())
    assert set(written) == LLADA_KEYS and list(written) == sorted(written)
    assert written["model_type"] == "llada" and written["architectures"] == ["LLaDAModelLM"]
    assert written["auto_map"]["AutoModel"] == "modeling_llada.LLaDAModelLM"
    from safetensors.torch import load_file

    names = set(load_file(str(tmp_path / "one" / "model.safetensors")))
    want = {f"model.transformer.blocks.{i}.{n}.weight" for i in range(2) for n in LLADA_LAYER}
    want |= {"model.transformer.wte.weight", "model.transformer.ln_f.weight",
             "model.transformer.ff_out.weight"}
    assert names == want
    model.save_pretrained(tmp_path / "sharded", max_shard_bytes=30_000)
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == want and len(set(index["weight_map"].values())) > 2
    assert index["metadata"]["total_size"] == sum(p.numel() * 4 for p in model.parameters())
    t = torch.randint(0, 60, (1, 8))
    pos = torch.arange(8)[None]
    ref, _ = model(t, pos)
    for sub in ("one", "sharded"):
        back = LLaDAModel.from_pretrained(tmp_path / sub)
        assert back.config.to_json() == cfg.to_json() and torch.equal(back(t, pos)[0], ref)
    bf16 = LLaDAModel.from_pretrained(tmp_path / "one", dtype=torch.bfloat16)
    assert bf16(t, pos)[0].dtype == torch.float32  # logits come back in fp32
    tied = random_llada(llada_config(weight_tying=True), seed=4)
    tied.save_pretrained(tmp_path / "tied")
    assert "model.transformer.ff_out.weight" not in load_file(
        str(tmp_path / "tied" / "model.safetensors"))
    assert torch.equal(LLaDAModel.from_pretrained(tmp_path / "tied")(t, pos)[0], tied(t, pos)[0])


def test_dream_checkpoint_has_the_released_layout_and_round_trips(tmp_path):
    cfg = dream_config()
    model = random_dream(cfg, seed=4)
    model.save_pretrained(tmp_path / "one")
    written = json.loads((tmp_path / "one" / "config.json").read_text())
    assert set(written) == DREAM_KEYS
    assert written["model_type"] == "Dream" and written["architectures"] == ["DreamModel"]
    assert written["mask_token_id"] == 63 and written["tie_word_embeddings"] is False
    assert written["torch_dtype"] == "float32"  # what the weights are
    from safetensors.torch import load_file

    names = set(load_file(str(tmp_path / "one" / "model.safetensors")))
    want = {f"model.layers.{i}.{n}" for i in range(2) for n in DREAM_LAYER}
    want |= {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    assert names == want
    model.save_pretrained(tmp_path / "sharded", max_shard_bytes=30_000)
    t = torch.randint(0, 64, (1, 8))
    pos = torch.arange(8)[None]
    ref, _ = model(t, pos)
    for sub in ("one", "sharded"):
        back = DreamModel.from_pretrained(tmp_path / sub)
        assert back.config.to_json() == {**cfg.to_json(), "torch_dtype": "float32"}
        assert torch.equal(back(t, pos)[0], ref)
    tied = random_dream(dream_config(tie_word_embeddings=True), seed=4)
    tied.save_pretrained(tmp_path / "tied")
    assert "lm_head.weight" not in load_file(str(tmp_path / "tied" / "model.safetensors"))
    assert torch.equal(DreamModel.from_pretrained(tmp_path / "tied")(t, pos)[0], tied(t, pos)[0])


def test_released_8b_and_7b_configs_parse_and_unsupported_variants_are_refused():
    llada = LLaDAConfig.from_json(LLaDAConfig().to_json())  # the released defaults
    assert (llada.d_model, llada.n_heads, llada.kv_heads, llada.hidden, llada.rows,
            llada.mask_token_id) == (4096, 32, 32, 12288, 126464, 126336)
    dream = DreamConfig.from_json(DreamConfig().to_json())
    assert (dream.head_dim, dream.num_key_value_heads, dream.mask_token_id) == (128, 4, 151666)
    for bad in ({"block_type": "sequential"}, {"alibi": True}, {"include_bias": True},
                {"layer_norm_type": "default"}, {"model_type": "llama"}):
        with pytest.raises(ValueError):
            LLaDAConfig.from_json({**LLaDAConfig().to_json(), **bad})
    for bad in ({"use_sliding_window": True}, {"rope_scaling": {"type": "yarn"}},
                {"model_type": "qwen2"}):
        with pytest.raises(ValueError):
            DreamConfig.from_json({**DreamConfig().to_json(), **bad})
    extra = LLaDAConfig.from_json({**llada_config().to_json(), "some_new_key": 3})
    assert extra.to_json()["some_new_key"] == 3  # unknown keys survive a round trip
