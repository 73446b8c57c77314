"""Trains the project's shared tokenizer and writes it to ``models/tokenizer/``.

Owns the tokenizer definition: byte-level BPE (GPT-2 style pre-tokenisation, so
every string round-trips exactly), 4096 entries of which the first three are
special:

  id 0  ``<|endoftext|>``  EOS and BOS (documents are separated by it)
  id 1  ``<|pad|>``        padding
  id 2  ``<|mask|>``       the mask token of the diffusion models

No BOS is added automatically (``encode(x)`` is just the tokens of ``x``), which
matches how the models are trained: on random windows of the token stream.
The output is a Hugging Face fast-tokenizer directory (tokenizer.json,
tokenizer_config.json with a plain "User:/Assistant:" chat template,
special_tokens_map.json) loadable with ``AutoTokenizer.from_pretrained``.

    python -m training.train_tokenizer [--vocab-size 4096] [--out models/tokenizer]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one core: tests share the machine
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from training.data import DEFAULT_TOKENIZER, load_split  # noqa: E402

EOS, PAD, MASK = "<|endoftext|>", "<|pad|>", "<|mask|>"
SPECIAL_TOKENS = [EOS, PAD, MASK]  # ids 0, 1, 2

# Rendered by vLLM's chat endpoint. The models only know Python, so this merely
# needs to be well defined: "User: ...\nAssistant: ..." with EOS after replies.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n"
    "{% elif message['role'] == 'user' %}User: {{ message['content'] }}\n"
    "{% else %}Assistant: {{ message['content'] }}" + EOS + "\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant: {% endif %}"
)


def build_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    return tok


def save_hf(tok: Tokenizer, out: Path, max_length: int = 1024) -> None:
    """Writes the three files ``AutoTokenizer`` needs into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    special = {"bos_token": EOS, "eos_token": EOS, "unk_token": EOS,
               "pad_token": PAD, "mask_token": MASK}
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True}
             for i, t in enumerate(SPECIAL_TOKENS)}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "padding_side": "left",
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def check(out: Path, samples: list[str]) -> None:
    """Loads the result through transformers and checks the round trip."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(out))
    assert (hf.eos_token_id, hf.bos_token_id, hf.pad_token_id) == (0, 0, 1)
    assert hf.convert_tokens_to_ids(MASK) == 2 and len(hf) == hf.vocab_size
    for text in samples:
        ids = hf.encode(text)
        assert hf.decode(ids) == text, "round trip failed"
    chat = hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                  add_generation_prompt=True)
    assert chat == "User: hi\nAssistant: ", repr(chat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=DEFAULT_TOKENIZER)
    args = ap.parse_args()

    t0 = time.time()
    train = load_split("train")
    tok = build_tokenizer(train, args.vocab_size)
    save_hf(tok, args.out)
    val = load_split("validation")
    check(args.out, val + ["  \tx = 'é€🙂'\r\n\n", "<|mask|>def f():<|endoftext|>"])
    n_bytes = sum(len(t.encode()) for t in val)
    n_tok = sum(len(e.ids) for e in tok.encode_batch(val))
    print(f"tokenizer: vocab {tok.get_vocab_size()} -> {args.out} in {time.time() - t0:.1f}s; "
          f"validation {n_bytes / n_tok:.2f} bytes/token ({n_tok} tokens)")


if __name__ == "__main__":
    main()
