"""Tiny AS-ARM (``anyorder_llama``) checkpoints for engine tests, and their exact
left-to-right conditionals from the pure-PyTorch reference (``model_executor/asarm.py``)."""

from __future__ import annotations

from pathlib import Path


def build_tiny_asarm(path: Path, *, vocab_size: int = 64, seed: int = 1, std: float = 0.3,
                     kv_heads: int = 1, tokenizer: bool = True) -> Path:
    """Random fp32 AS-ARM (hidden 64, 2 layers, 2 heads of 32 (GQA), vocab ``vocab_size``)
    with the char tokenizer of ``tiny_models``; EOS id 0. Larger ``std`` = peakier."""
    from tiny_models import write_char_tokenizer

    from vllm_anyorder.model_executor.asarm import AsArmConfig, random_asarm

    path = Path(path)
    if (path / "config.json").exists():
        return path
    cfg = AsArmConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=kv_heads,
                      head_dim=32, max_position_embeddings=1024,
                      extra={"eos_token_id": 0, "pad_token_id": 1, "bos_token_id": None})
    random_asarm(cfg, seed=seed, std=std).save_pretrained(path)
    if tokenizer:
        write_char_tokenizer(path, vocab_size)
    return path


def build_tiny_xlnet(path: Path, *, vocab_size: int = 64, seed: int = 1, std: float = 0.3,
                     attn_gain: float = 1.0, tokenizer: bool = True) -> Path:
    """Random fp32 XLNet AS-ARM (``XLNetLMHeadModel``: d_model 64, 2 layers, 2 heads of 32,
    d_inner 128, vocab ``vocab_size``) with the char tokenizer; EOS id 0. ``attn_gain``
    scales the q, k and r projections: sharper, more position-dependent attention, so the
    next token depends more on the last decoded ones."""
    import torch
    from tiny_models import write_char_tokenizer

    from vllm_anyorder.model_executor.xlnet_asarm import random_xlnet

    path = Path(path)
    if (path / "config.json").exists():
        return path
    model = random_xlnet(vocab_size, seed=seed, d_model=64, n_layer=2, n_head=2, d_inner=128,
                         std=std)
    with torch.no_grad():
        for name, param in model.model.named_parameters():
            if name.rsplit(".", 1)[-1] in ("q", "k", "r") and ".rel_attn." in name:
                param.mul_(attn_gain)
    model.config.eos_token_id, model.config.pad_token_id = 0, 1
    model.save_pretrained(path)
    if tokenizer:
        write_char_tokenizer(path, vocab_size)
    return path


def load_reference(path):
    """The engine-free AS-ARM of a checkpoint of either format (Llama-based or XLNet)."""
    import json

    config = json.loads((Path(path) / "config.json").read_text())
    if "XLNetLMHeadModel" in (config.get("architectures") or []):
        from vllm_anyorder.model_executor.xlnet_asarm import XLNetAsArm

        return XLNetAsArm.from_pretrained(
            path, banned_token_ids=config.get("anyorder_banned_token_ids") or ())
    from vllm_anyorder.model_executor.asarm import load

    return load(path)


class Conditionals:
    """Exact p(next | prompt, generated prefix) and the drafting distributions
    q(x_{n+i} | decoded prefix) of an AS-ARM checkpoint (fp64 log-softmax inputs)."""

    def __init__(self, path) -> None:
        self.model = load_reference(path)
        self._cache: dict = {}

    def logits(self, prompt, generated, query_offsets=(0,)):
        """[len(query_offsets), V] logits of the positions len(prompt + generated) + offset,
        each given the prompt (visible) and ``generated`` (in order), nothing else."""
        import torch

        key = (tuple(prompt), tuple(generated), tuple(query_offsets))
        if key not in self._cache:
            seq = list(prompt) + list(generated)
            order = [0] * len(prompt) + list(range(1, len(generated) + 1))
            self._cache[key] = self.model.content_and_query(
                torch.tensor(seq), torch.arange(len(seq)), torch.tensor(order),
                torch.tensor([len(seq) + o for o in query_offsets])).double()
        return self._cache[key]
