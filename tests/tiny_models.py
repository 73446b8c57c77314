"""Tiny Hugging Face-format checkpoints the tests build (no hub, no download).

A character-level tokenizer (``tokenizers`` WordLevel over single characters) and random
Llama models in fp32 with head_dim 32 (vLLM's CPU attention needs head_dim >= 32).
"""

from __future__ import annotations

import json
import string
from pathlib import Path

SPECIALS = ["<eos>", "<pad>", "<unk>"]
CHARS = list(string.ascii_lowercase) + list(string.digits) + list(" \n.,:;!?()=+-*/'\"_#[]{}<>")


def char_vocab(vocab_size: int) -> list[str]:
    tokens = SPECIALS + CHARS
    if vocab_size > len(tokens):
        tokens += [f"<x{i}>" for i in range(vocab_size - len(tokens))]
    return tokens[:vocab_size]


def write_char_tokenizer(path: Path, vocab_size: int) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(char_vocab(vocab_size))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "bos_token": None, "add_bos_token": False, "model_max_length": 4096,
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}",
    }))
    (path / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}))


def build_tiny_llama(path: Path, *, vocab_size: int = 64, hidden: int = 64, layers: int = 2,
                     heads: int = 2, init_range: float = 0.2, seed: int = 0,
                     max_positions: int = 1024) -> Path:
    """Random fp32 Llama with a char tokenizer; larger ``init_range`` = peakier logits."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    if (path / "config.json").exists():
        return path
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        head_dim=hidden // heads, max_position_embeddings=max_positions,
        initializer_range=init_range, bos_token_id=None, eos_token_id=0, pad_token_id=1,
        tie_word_embeddings=False, torch_dtype="float32",
    )
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    model.save_pretrained(path, safe_serialization=True)
    write_char_tokenizer(path, vocab_size)
    return path


def build_cyclic_llama(path: Path, *, cycle: str = "abcdefghij klmnop\n", steps: int = 60,
                       seed: int = 0) -> Path:
    """A tiny Llama trained for a few seconds to continue a fixed cyclic text: its greedy
    output loops, so speculative drafts really get accepted (random weights accept nothing)."""
    import torch
    from transformers import LlamaForCausalLM

    path = Path(path)
    if (path / "config.json").exists():
        return path
    build_tiny_llama(path, init_range=0.02, seed=seed)
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)
    vocab = {t: i for i, t in enumerate(char_vocab(model.config.vocab_size))}
    ids = torch.tensor([vocab[c] for c in cycle * 8])
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(cycle), (8,), generator=gen)
        batch = torch.stack([ids[s: s + 40] for s in starts])
        loss = model(batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval().save_pretrained(path, safe_serialization=True)
    return path


def build_tiny_drafter(path: Path, sequences, *, vocab_size: int, steps: int = 150,
                       max_length: int = 64, seed: int = 0) -> Path:
    """A tiny MDLM-format masked-diffusion drafter (hidden 64, head_dim 32) trained for a few
    seconds to fill masked suffixes of ``sequences`` (lists of token ids of the target's
    vocabulary), so its drafts agree with a tiny target often enough to be accepted.
    ``sequences=None`` keeps the random initialisation. Mask id = ``vocab_size`` (the extra
    row), as in the released MDLM format."""
    import torch

    from vllm_anyorder.model_executor.masked_diffusion import mdlm_spec, random_drafter, save_drafter

    path = Path(path)
    if (path / "config.json").exists():
        return path
    spec = mdlm_spec(vocab_size=vocab_size + 1, hidden_size=64, cond_dim=32, n_blocks=2,
                     n_heads=2, max_length=max_length)
    model = random_drafter(spec, seed=seed)
    if sequences is not None:
        gen = torch.Generator().manual_seed(seed)
        data = [torch.tensor(s[:max_length]) for s in sequences]
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model.train()
        for _ in range(steps):
            picks = torch.randint(0, len(data), (16,), generator=gen).tolist()
            width = min(len(data[i]) for i in picks)
            batch = torch.stack([data[i][:width] for i in picks])
            split = torch.randint(1, width, (16, 1), generator=gen)
            rate = torch.rand(16, 1, generator=gen)
            col = torch.arange(width)[None, :]
            masked = (col >= split) & (torch.rand(batch.shape, generator=gen) < rate)
            masked |= col == split  # at least one masked position per row
            noisy = batch.masked_fill(masked, spec.mask_token_id)
            logits = model(noisy, torch.zeros(16))[..., : spec.num_tokens]
            loss = torch.nn.functional.cross_entropy(logits[masked], batch[masked])
            opt.zero_grad()
            loss.backward()
            opt.step()
    save_drafter(model.eval(), path)
    write_char_tokenizer(path, vocab_size)  # the target's tokenizer: start-up checks compare
    return path


def build_tiny_dllm(path: Path, kind: str = "llada", *, vocab_size: int = 64, seed: int = 0,
                    std: float = 0.3, max_positions: int = 512) -> Path:
    """A random fp32 diffusion LLM in the released format of ``kind`` ("llada" or "dream"):
    hidden 64, 2 layers, 2 heads (head_dim 32), char tokenizer; mask id = the last vocabulary
    row, EOS = 0."""
    import torch

    from vllm_anyorder.model_executor.dream import DreamConfig, random_dream
    from vllm_anyorder.model_executor.llada import LLaDAConfig, random_llada

    path = Path(path)
    if (path / "config.json").exists():
        return path
    mask = vocab_size - 1
    if kind == "llada":
        model = random_llada(LLaDAConfig(
            d_model=64, n_heads=2, n_kv_heads=2, n_layers=2, mlp_hidden_size=128,
            vocab_size=vocab_size, embedding_size=vocab_size, max_sequence_length=max_positions,
            rope_theta=10000.0, mask_token_id=mask, eos_token_id=0, pad_token_id=1), seed, std)
    else:
        model = random_dream(DreamConfig(
            vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=max_positions,
            rope_theta=10000.0, mask_token_id=mask, bos_token_id=None, eos_token_id=0,
            pad_token_id=1), seed, std)
    model.to(torch.float32).save_pretrained(path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    write_char_tokenizer(path, vocab_size)
    return path
