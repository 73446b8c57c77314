"""Masked-diffusion drafters (MDLM / SEDD-absorb): released file layouts, strict loading,
read_spec errors, and the forward pass against a plain reference written from the format notes
(shared/notes/released-formats.md sections 2-3). Tiny random checkpoints only; pure torch."""

import json
import math
from collections import OrderedDict

import pytest
import torch
from safetensors.torch import load_file, save_file

from vllm_anyorder.model_executor.masked_diffusion import (
    MaskedDiffusionFormatError, MaskedDiffusionLM, load_drafter, loglinear_sigma, mdlm_spec,
    random_drafter, read_spec, save_drafter, sedd_spec)

torch.set_num_threads(1)

# The tensor names of kuleshov-group/mdlm-owt's model.safetensors (notes, section 2), for 2 blocks.
MDLM_NAMES = {
    "backbone.vocab_embed.embedding",
    "backbone.sigma_map.mlp.0.weight", "backbone.sigma_map.mlp.0.bias",
    "backbone.sigma_map.mlp.2.weight", "backbone.sigma_map.mlp.2.bias",
    "backbone.rotary_emb.inv_freq",
    *(f"backbone.blocks.{n}.{leaf}" for n in range(2) for leaf in (
        "norm1.weight", "attn_qkv.weight", "attn_out.weight", "norm2.weight",
        "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias",
        "adaLN_modulation.weight", "adaLN_modulation.bias")),
    "backbone.output_layer.norm_final.weight",
    "backbone.output_layer.linear.weight", "backbone.output_layer.linear.bias",
    "backbone.output_layer.adaLN_modulation.weight", "backbone.output_layer.adaLN_modulation.bias",
}
MDLM_CONFIG_KEYS = {"_name_or_path", "architectures", "auto_map", "cond_dim", "dropout",
                    "hidden_dim", "model_length", "model_type", "n_blocks", "n_heads",
                    "return_dict", "time_conditioning", "torch_dtype", "transformers_version",
                    "vocab_size"}
V, H, C, HEADS, L = 33, 64, 32, 2, 48  # 32 real tokens + mask row; head_dim 32


def expected_shapes(prefix, vocab=V, hidden=H, cond=C, heads=HEADS):
    hd = hidden // heads
    shapes = {"vocab_embed.embedding": (vocab, hidden), "sigma_map.mlp.0.weight": (cond, 256),
              "sigma_map.mlp.0.bias": (cond,), "sigma_map.mlp.2.weight": (cond, cond),
              "sigma_map.mlp.2.bias": (cond,), "rotary_emb.inv_freq": (hd // 2,),
              "output_layer.norm_final.weight": (hidden,),
              "output_layer.linear.weight": (vocab, hidden), "output_layer.linear.bias": (vocab,),
              "output_layer.adaLN_modulation.weight": (2 * hidden, cond),
              "output_layer.adaLN_modulation.bias": (2 * hidden,)}
    for n in range(2):
        shapes.update({f"blocks.{n}.{k}": v for k, v in {
            "norm1.weight": (hidden,), "attn_qkv.weight": (3 * hidden, hidden),
            "attn_out.weight": (hidden, hidden), "norm2.weight": (hidden,),
            "mlp.0.weight": (4 * hidden, hidden), "mlp.0.bias": (4 * hidden,),
            "mlp.2.weight": (hidden, 4 * hidden), "mlp.2.bias": (hidden,),
            "adaLN_modulation.weight": (6 * hidden, cond),
            "adaLN_modulation.bias": (6 * hidden,)}.items()})
    return {prefix + k: v for k, v in shapes.items()}


def mdlm(time_conditioning=False, dtype="float32", seed=0, std=0.2):
    spec = mdlm_spec(V, H, C, 2, HEADS, L, time_conditioning=time_conditioning, torch_dtype=dtype)
    return random_drafter(spec, seed=seed, init_std=std)  # large weights: peaked, O(1-10) outputs


def sedd(scale_by_sigma=True, seed=0, std=0.2):
    return random_drafter(sedd_spec(V - 1, H, C, 2, HEADS, L, scale_by_sigma=scale_by_sigma),
                          seed=seed, init_std=std)


def batch(seed=0, b=3, length=20, masked_from=12):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V - 1, (b, length), generator=g)
    ids[:, masked_from:] = V - 1
    ids[0, 3] = V - 1  # a masked position inside the context too
    return ids, torch.rand(b, generator=g) * 0.9 + 0.05


# ------------------------------------------------------------------ released layouts
def test_mdlm_files_are_the_released_layout(tmp_path):
    save_drafter(mdlm(), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert set(cfg) == MDLM_CONFIG_KEYS
    assert (cfg["model_type"], cfg["architectures"], cfg["return_dict"]) == ("mdlm", ["MDLM"], False)
    assert cfg["auto_map"] == {"AutoConfig": "configuration_mdlm.MDLMConfig",
                               "AutoModelForMaskedLM": "modeling_mdlm.MDLM"}
    assert (cfg["vocab_size"], cfg["hidden_dim"], cfg["cond_dim"], cfg["model_length"]) == (V, H, C, L)
    state = load_file(str(tmp_path / "model.safetensors"))
    assert set(state) == MDLM_NAMES
    assert {k: tuple(v.shape) for k, v in state.items()} == expected_shapes("backbone.")
    hd = H // HEADS
    torch.testing.assert_close(state["backbone.rotary_emb.inv_freq"],
                               1.0 / 10000 ** (torch.arange(0, hd, 2).float() / hd))
    spec = read_spec(tmp_path)
    assert (spec.family, spec.mask_token_id, spec.num_tokens, spec.max_length) == ("mdlm", V - 1, V - 1, L)
    assert (spec.time_conditioning, spec.scale_by_sigma, spec.weights_file) == (False, False, "model.safetensors")


@pytest.mark.parametrize("weights", ["safetensors", "bin"])
def test_sedd_files_are_the_released_layout(tmp_path, weights):
    model = sedd()
    save_drafter(model, tmp_path, sedd_weights=weights)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["tokens"] == V - 1 and cfg["graph"]["type"] == "absorb"
    assert cfg["noise"]["type"] == "loglinear" and "model_type" not in cfg
    assert {k: cfg["model"][k] for k in ("hidden_size", "cond_dim", "length", "n_blocks", "n_heads",
                                         "scale_by_sigma")} == dict(
        hidden_size=H, cond_dim=C, length=L, n_blocks=2, n_heads=HEADS, scale_by_sigma=True)
    if weights == "bin":
        state = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
        assert type(state) is OrderedDict
    else:
        state = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["config.json", "pytorch_model.bin" if weights == "bin" else "model.safetensors"])
    assert {k: tuple(v.shape) for k, v in state.items()} == expected_shapes("")
    spec = read_spec(tmp_path)
    assert (spec.family, spec.vocab_size, spec.mask_token_id, spec.time_conditioning) == ("sedd", V, V - 1, True)
    ids, t = batch()
    loaded = load_drafter(tmp_path)
    torch.testing.assert_close(loaded(ids, loglinear_sigma(t)), model(ids, loglinear_sigma(t)), rtol=0, atol=0)


@pytest.mark.parametrize("make", [lambda: mdlm(), lambda: mdlm(True)])
def test_mdlm_round_trip_gives_identical_outputs(tmp_path, make):
    model = make()
    save_drafter(model, tmp_path)
    loaded = load_drafter(tmp_path)
    assert not loaded.training and loaded.spec == model.spec
    ids, t = batch()
    with torch.no_grad():
        assert torch.equal(loaded.token_logits(ids, t), model.token_logits(ids, t))


def test_bf16_round_trip_keeps_fp32_rotary_and_the_dtype(tmp_path):
    model = mdlm(dtype="bfloat16")
    assert model.dit.rotary_emb.inv_freq.dtype == torch.float32
    save_drafter(model, tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    assert state["backbone.rotary_emb.inv_freq"].dtype == torch.float32
    assert state["backbone.blocks.0.attn_qkv.weight"].dtype == torch.bfloat16
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    loaded = load_drafter(tmp_path)
    assert loaded.dit.output_layer.linear.weight.dtype == torch.bfloat16
    as_fp32 = load_drafter(tmp_path, dtype="float32")
    assert as_fp32.dit.output_layer.linear.weight.dtype == torch.float32
    ids, t = batch()
    with torch.no_grad():
        out16, out32 = loaded.token_logits(ids, t), as_fp32.token_logits(ids, t)
    assert out16.dtype == torch.float32 and torch.equal(out16, model.token_logits(ids, t))
    masked = ids == V - 1
    assert (out16[masked].argmax(-1) == out32[masked].argmax(-1)).float().mean() > 0.9


# ------------------------------------------------------------------ strict loading
@pytest.mark.parametrize("edit,words", [
    (lambda s: s.pop("backbone.blocks.1.mlp.2.bias"), ["missing", "backbone.blocks.1.mlp.2.bias"]),
    (lambda s: s.pop("backbone.rotary_emb.inv_freq"), ["missing", "backbone.rotary_emb.inv_freq"]),
    (lambda s: s.update({"backbone.extra.weight": torch.zeros(2)}), ["unexpected", "backbone.extra.weight"]),
    (lambda s: s.update({"backbone.output_layer.linear.bias": torch.zeros(7)}),
     ["wrong shape", "backbone.output_layer.linear.bias (7,)"]),
    (lambda s: [s.update({k[len("backbone."):]: s.pop(k)}) for k in list(s)],  # SEDD names in MDLM
     ["missing", "unexpected", "'backbone.' prefix", "backbone.blocks.0.adaLN_modulation.bias"]),
])
def test_strict_loading_names_the_bad_tensors(tmp_path, edit, words):
    save_drafter(mdlm(), tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    edit(state)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(MaskedDiffusionFormatError) as err:
        load_drafter(tmp_path)
    for word in words:
        assert word in str(err.value)


def test_unreadable_weights_are_a_format_error(tmp_path):
    save_drafter(sedd(), tmp_path, sedd_weights="bin")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not a pickle")
    with pytest.raises(MaskedDiffusionFormatError, match="cannot read weights"):
        load_drafter(tmp_path)


# ------------------------------------------------------------------ read_spec errors
def _mdlm_cfg(**over):
    cfg = {"model_type": "mdlm", "vocab_size": V, "hidden_dim": H, "cond_dim": C, "n_blocks": 2,
           "n_heads": HEADS, "model_length": L, "time_conditioning": False}
    return {k: v for k, v in {**cfg, **over}.items() if v is not None}


def _sedd_cfg(graph="absorb", noise="loglinear", **model_over):
    model = {"hidden_size": H, "cond_dim": C, "length": L, "n_blocks": 2, "n_heads": HEADS,
             "scale_by_sigma": True, **model_over}
    return {"tokens": V - 1, "graph": {"type": graph}, "noise": {"type": noise},
            "model": {k: v for k, v in model.items() if v is not None}}


@pytest.mark.parametrize("cfg,files,match", [
    (None, ["model.safetensors"], "no config.json"),
    ("{not json", ["model.safetensors"], "not valid JSON"),
    ("[1, 2]", ["model.safetensors"], "not a JSON object"),
    ({"model_type": "llama", "vocab_size": 10}, ["model.safetensors"], "neither an MDLM"),
    (_sedd_cfg(graph="uniform"), ["pytorch_model.bin"], "absorb"),
    (_sedd_cfg(noise="geometric"), ["pytorch_model.bin"], "loglinear"),
    (_mdlm_cfg(n_heads=None), ["model.safetensors"], "missing key 'n_heads'"),
    (_sedd_cfg(length=None), ["pytorch_model.bin"], "missing key 'model.length'"),
    (_mdlm_cfg(), ["pytorch_model.bin"], "expected model.safetensors"),
    (_sedd_cfg(), [], "model.safetensors or pytorch_model.bin"),
    (_mdlm_cfg(n_heads=3), ["model.safetensors"], "head_dim"),
    (_mdlm_cfg(vocab_size=0), ["model.safetensors"], "positive integer"),
    (_mdlm_cfg(torch_dtype="int8"), ["model.safetensors"], "torch_dtype"),
])
def test_read_spec_refuses_bad_directories(tmp_path, cfg, files, match):
    if cfg is not None:
        (tmp_path / "config.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    for name in files:
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(MaskedDiffusionFormatError, match=match):
        read_spec(tmp_path)


def test_read_spec_refuses_missing_paths_and_files(tmp_path):
    with pytest.raises(MaskedDiffusionFormatError, match="not a directory"):
        read_spec(tmp_path / "missing")
    (tmp_path / "f").write_text("x")
    with pytest.raises(MaskedDiffusionFormatError, match="not a directory"):
        read_spec(tmp_path / "f")


def test_read_spec_prefers_sedd_safetensors_and_accepts_the_bin(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_sedd_cfg()))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    assert read_spec(tmp_path).weights_file == "pytorch_model.bin"
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert read_spec(tmp_path).weights_file == "model.safetensors"


# ------------------------------------------------------------------ forward vs a plain reference
def reference_forward(state, spec, ids, sigma, key_mask=None):
    """The DiT of the format notes, written out from the released tensor names in float64:
    einsum attention, explicit loops over blocks and heads."""
    pre = "backbone." if spec.family == "mdlm" else ""
    w = {k[len(pre):]: v.double() for k, v in state.items()}
    b, length = ids.shape
    hd = spec.hidden_size // spec.n_heads
    if not spec.time_conditioning:
        sigma = torch.zeros_like(sigma)
    sigma = sigma.double()

    def lin(x, name, bias=True):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if bias else y

    def norm(x, name):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + 1e-5) * w[name + ".weight"]

    def gelu_tanh(x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    freqs = torch.exp(-math.log(10000) * torch.arange(128, dtype=torch.float64) / 128)
    feats = torch.cat([torch.cos(sigma[:, None] * freqs), torch.sin(sigma[:, None] * freqs)], -1)
    c = torch.nn.functional.silu(lin(torch.nn.functional.silu(lin(feats, "sigma_map.mlp.0")), "sigma_map.mlp.2"))
    angles = torch.arange(length, dtype=torch.float64)[:, None] * w["rotary_emb.inv_freq"][None]
    cos, sin = torch.cos(angles), torch.sin(angles)  # [L, hd/2]

    def rope(x):  # x [B, L, hd], rotate-half: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    x = w["vocab_embed.embedding"][ids]
    for n in range(spec.n_blocks):
        p = f"blocks.{n}."
        mods = lin(c, p + "adaLN_modulation")[:, None, :]
        shift1, scale1, gate1, shift2, scale2, gate2 = [
            mods[..., i * spec.hidden_size:(i + 1) * spec.hidden_size] for i in range(6)]
        h = norm(x, p + "norm1") * (1 + scale1) + shift1
        qkv = lin(h, p + "attn_qkv", bias=False)
        heads = []
        for j in range(spec.n_heads):
            q = rope(qkv[..., j * hd:(j + 1) * hd])
            k = rope(qkv[..., spec.hidden_size + j * hd: spec.hidden_size + (j + 1) * hd])
            v = qkv[..., 2 * spec.hidden_size + j * hd: 2 * spec.hidden_size + (j + 1) * hd]
            att = torch.einsum("bqd,bkd->bqk", q, k) / math.sqrt(hd)
            if key_mask is not None:
                att = att.masked_fill(~key_mask[:, None, :], float("-inf"))
            heads.append(torch.einsum("bqk,bkd->bqd", att.softmax(-1), v))
        x = x + gate1 * lin(torch.cat(heads, -1), p + "attn_out", bias=False)
        h = norm(x, p + "norm2") * (1 + scale2) + shift2
        x = x + gate2 * lin(gelu_tanh(lin(h, p + "mlp.0")), p + "mlp.2")
    shift, scale = lin(c, "output_layer.adaLN_modulation")[:, None, :].chunk(2, -1)
    out = lin(norm(x, "output_layer.norm_final") * (1 + scale) + shift, "output_layer.linear")
    if spec.family == "sedd":
        if spec.scale_by_sigma:
            out = out - torch.log(torch.expm1(sigma))[:, None, None] - math.log(spec.vocab_size - 1)
        out = out.scatter(-1, ids[..., None], 0.0)
    return out.float()


@pytest.mark.parametrize("make", [lambda: mdlm(std=0.1), lambda: mdlm(True, std=0.1),
                                  lambda: sedd(std=0.1), lambda: sedd(False, std=0.1)],
                         ids=["mdlm", "mdlm-time-cond", "sedd", "sedd-unscaled"])
def test_forward_matches_the_plain_reference(tmp_path, make):
    model = make()  # std 0.1: outputs O(1), so 1e-5 is a tight fp32 tolerance
    save_drafter(model, tmp_path)
    file = read_spec(tmp_path).weights_file
    state = load_file(str(tmp_path / file))
    ids, t = batch(seed=3, length=L)
    sigma = loglinear_sigma(t)
    key_mask = torch.ones_like(ids, dtype=torch.bool)
    key_mask[1, 30:] = False
    with torch.no_grad():
        for km in (None, key_mask):
            out = load_drafter(tmp_path)(ids, sigma, km)
            ref = reference_forward(state, model.spec, ids, sigma, km)
            real = torch.ones_like(ids, dtype=torch.bool) if km is None else km
            assert out.shape == (3, L, V) and out.dtype == torch.float32
            torch.testing.assert_close(out[real], ref[real], rtol=0, atol=1e-5)


def test_mdlm_without_time_conditioning_ignores_sigma():
    model = mdlm()
    ids, _ = batch()
    with torch.no_grad():
        assert torch.equal(model(ids, torch.full((3,), 0.1)), model(ids, torch.full((3,), 5.0)))
        conditioned = mdlm(True)
        assert not torch.equal(conditioned(ids, torch.full((3,), 0.1)), conditioned(ids, torch.full((3,), 5.0)))


# ------------------------------------------------------------------ token_logits
def test_sedd_token_logits_is_invariant_to_the_scale_by_sigma_constant(tmp_path):
    scaled, plain = sedd(True), sedd(False)
    plain.load_state_dict(scaled.state_dict())
    ids, t = batch()
    masked = ids == V - 1
    with torch.no_grad():
        raw_s, raw_p = scaled(ids, loglinear_sigma(t)), plain(ids, loglinear_sigma(t))
        diff = (raw_s - raw_p)[:, :, : V - 1]  # constant per row away from the scatter column
        const = -torch.log(torch.expm1(loglinear_sigma(t))) - math.log(V - 1)
        torch.testing.assert_close(diff[masked], const[:, None, None].expand_as(diff)[masked])
        a, b = scaled.token_logits(ids, t), plain.token_logits(ids, t)
    assert a.shape == (3, 20, V - 1)
    torch.testing.assert_close(a[masked].softmax(-1), b[masked].softmax(-1))


@pytest.mark.parametrize("make", [lambda: sedd(), lambda: mdlm()], ids=["sedd", "mdlm"])
def test_token_logits_drops_the_mask_column_and_carries_clean_tokens(make):
    model = make()
    ids, t = batch()
    key_mask = torch.ones_like(ids, dtype=torch.bool)
    key_mask[2, 17:] = False  # right padding
    with torch.no_grad():
        raw = model(ids, loglinear_sigma(t), key_mask)
        scores = model.token_logits(ids, t, key_mask)
    if model.spec.family == "sedd":
        assert (raw[ids == V - 1][:, V - 1] == 0).all()  # scatter of 0 at the mask input
        clean = ids != V - 1
        assert (raw[clean].gather(-1, ids[clean][:, None]) == 0).all()  # and at clean inputs
    masked = (ids == V - 1) & key_mask
    torch.testing.assert_close(scores[masked], raw[masked][:, : V - 1], rtol=0, atol=1e-5)
    clean = (ids != V - 1) & key_mask
    probs = scores[clean].softmax(-1)
    assert torch.equal(probs.argmax(-1), ids[clean]) and torch.allclose(probs.max(-1).values, torch.ones(()))
    assert torch.isfinite(scores[masked]).all() and (scores[~key_mask] == 0).all()


@pytest.mark.parametrize("make", [lambda: sedd(), lambda: mdlm(True)], ids=["sedd", "mdlm"])
def test_right_padding_does_not_change_real_positions(make):
    model = make()
    ids, t = batch(length=20, masked_from=12)
    padded = torch.cat([ids, torch.randint(0, V, (3, 9))], dim=1)  # junk, mask ids included
    key_mask = torch.ones_like(padded, dtype=torch.bool)
    key_mask[:, 20:] = False
    with torch.no_grad():
        torch.testing.assert_close(model.token_logits(padded, t, key_mask)[:, :20],
                                   model.token_logits(ids, t), rtol=0, atol=1e-5)
        torch.testing.assert_close(model(padded, loglinear_sigma(t), key_mask)[:, :20],
                                   model(ids, loglinear_sigma(t)), rtol=0, atol=1e-5)
    # one padded row in a batch with an unpadded one
    mixed = padded.clone()
    mixed_mask = key_mask.clone()
    mixed[0, 20:] = V - 1
    mixed_mask[0, 20:] = True
    with torch.no_grad():
        out = model.token_logits(mixed, t, mixed_mask)
        torch.testing.assert_close(out[1:, :20], model.token_logits(ids[1:], t[1:]), rtol=0, atol=1e-5)


def test_model_is_trainable_with_the_restricted_output_layer():
    model = mdlm()
    model.train()
    ids, t = batch()
    target = torch.randint(0, V - 1, ids.shape)
    masked = ids == V - 1
    logits = model(ids, t, positions=masked)
    assert logits.shape == (int(masked.sum()), V)
    torch.testing.assert_close(logits, model(ids, t)[masked], rtol=0, atol=1e-5)
    torch.nn.functional.cross_entropy(logits[:, : V - 1], target[masked]).backward()
    assert model.dit.vocab_embed.embedding.grad is not None
    assert isinstance(model, MaskedDiffusionLM)


def test_read_spec_needs_no_torch(tmp_path):
    """The front-end start-up check imports the module and reads configs without torch."""
    import subprocess
    import sys

    (tmp_path / "config.json").write_text(json.dumps(_mdlm_cfg()))
    (tmp_path / "model.safetensors").write_bytes(b"")
    code = ("import sys; sys.modules['torch'] = None\n"
            "from vllm_anyorder.model_executor.masked_diffusion import read_spec\n"
            f"print(read_spec({str(tmp_path)!r}).mask_token_id)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(V - 1)


def test_save_replaces_the_other_weights_file(tmp_path):
    save_drafter(sedd(), tmp_path)  # model.safetensors
    save_drafter(sedd(seed=1), tmp_path, sedd_weights="bin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "pytorch_model.bin"]
