"""training.lora: an attached adapter starts at the base model, trains only A and B, and the
trainer's merge and ``build`` from the saved adapter give the same weights."""

import json

import torch
from safetensors.torch import load_file

from tests.tiny_models import build_tiny_llama
from training import lora


def _llama(path):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32)


def test_attach_starts_at_base_and_trains_only_adapters(tmp_path):
    build_tiny_llama(tmp_path / "base")
    model = _llama(tmp_path / "base")
    ids = torch.randint(0, 64, (2, 12))
    before = model(input_ids=ids).logits
    layer = model.model.layers[0]
    linears = [getattr(layer.self_attn, n) for n in lora.TARGETS[:4]] + \
        [getattr(layer.mlp, n) for n in lora.TARGETS[4:]]
    per_layer = sum(4 * (m.in_features + m.out_features) for m in linears)
    hidden, layers = model.config.hidden_size, model.config.num_hidden_layers
    trainable = lora.attach(model, rank=4, alpha=8, seed=0)
    assert trainable == layers * per_layer and hidden > 0
    assert torch.equal(model(input_ids=ids).logits, before), "B = 0: the base model exactly"
    loss = model(input_ids=ids).logits.square().mean()
    loss.backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None}
    assert grads and all(".lora_A" in n or ".lora_B" in n for n in grads)


def test_merge_equals_adapter_forward_and_build(tmp_path):
    build_tiny_llama(tmp_path / "base")
    model = _llama(tmp_path / "base").to(torch.bfloat16).float()  # a bf16 checkpoint's values
    lora.attach(model, rank=4, alpha=8, seed=0)
    with torch.no_grad():  # a trained-looking adapter, already on the bf16 grid
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_((torch.randn_like(p) * 0.05).to(torch.bfloat16).float())
    ids = torch.randint(0, 64, (2, 12))
    adapted = model(input_ids=ids).logits
    lora.save_adapter(model, tmp_path / "ad", {"base": str(tmp_path / "base"),
                                               "built": str(tmp_path / "built"),
                                               "rank": 4, "alpha": 8})
    merged = lora.merge(model)
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    # the merged weights are rounded to bf16: close to the adapter's forward, not equal
    assert torch.allclose(merged(input_ids=ids).logits, adapted, atol=0.05)
    built = lora.build(tmp_path / "ad", quiet=True)
    on_disk = load_file(str(built / "model.safetensors"))
    for name, w in merged.state_dict().items():
        if name in on_disk:
            assert torch.equal(on_disk[name].float(), w.to(torch.bfloat16).float()), name
    assert json.loads((built / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert (built / lora.STAMP).read_text().strip() == lora.adapter_sha1(tmp_path / "ad")
