"""Trains a small Llama-architecture causal LM on the stdlib corpus, on one CPU core.

Owns the autoregressive models of the project: ``models/ar-target/`` (defaults)
and ``models/ar-drafter/`` (same script, smaller sizes; see training/README.md).

Data: the train split of ``training.data`` tokenised with ``models/tokenizer``,
each file preceded by ``<|endoftext|>`` and concatenated into one stream; every
step draws ``--batch-size`` random windows of ``--seq-len + 1`` tokens from it
with a generator seeded by (seed, step), so a resumed run sees the same batches.
Validation loss is measured on non-overlapping windows of the validation split:
a fixed subset every ``--eval-every`` steps, all of them at the end.

Schedule (``training.loop``, shared by the trainers): AdamW, linear warmup then
cosine decay to ``--min-lr-ratio`` of the peak. Progress is max(step / --max-steps, elapsed / --minutes), so the cosine
ends exactly when the first of the two budgets runs out. Checkpoints (model,
optimizer, step, elapsed time, log) go to ``training/checkpoints/<name>/last.pt``
every ``--ckpt-every`` minutes, on Ctrl-C and at the end; ``--resume`` continues.

The result is saved in bf16 safetensors with a copy of the tokenizer, a
``training_log.json`` and a ``MODEL_CARD.md`` (see ``training.model_card``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from training import loop  # noqa: E402
from training.model_card import write_model_card  # noqa: E402
from training.windows import (  # noqa: E402
    random_windows, spread, step_generator, strided_windows, token_stream)

EOS_ID, PAD_ID = 0, 1


def parse_args(argv=None):
    ap = loop.parser(__doc__, "ar-target")
    a = ap.add_argument
    loop.add_size_args(ap)
    a("--kv-heads", type=int, default=None, help="default: --heads")
    a("--max-positions", type=int, default=1024)
    a("--rope-theta", type=float, default=10000.0)
    a("--seq-len", type=int, default=256)
    a("--batch-size", type=int, default=8)
    loop.add_loop_args(ap, eval_every=200, eval_windows=48)
    args = loop.parse(ap, argv)
    args.kv_heads = args.kv_heads or args.heads
    head_dim = args.hidden // args.heads
    if head_dim * args.heads != args.hidden or head_dim < 32:
        ap.error(f"hidden/heads must divide evenly into head_dim >= 32 (vLLM CPU), got {head_dim}")
    return args


def build_model(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=Tokenizer.from_file(str(args.tokenizer / "tokenizer.json")).get_vocab_size(),
        hidden_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads, intermediate_size=args.intermediate,
        max_position_embeddings=args.max_positions, rope_theta=args.rope_theta,
        tie_word_embeddings=True, bos_token_id=EOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
    )
    return LlamaForCausalLM(config)


def sample_batch(stream: torch.Tensor, args, step: int) -> torch.Tensor:
    return random_windows(stream, args.seq_len + 1, args.batch_size,
                          step_generator(args.seed, step))


def val_windows(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Windows of ``seq_len + 1`` tokens every ``seq_len`` tokens: every token but the first
    is predicted once."""
    return strided_windows(stream, seq_len + 1, seq_len)


def lm_loss(model, batch: torch.Tensor, bf16: bool, reduction: str = "mean") -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(),
                           reduction=reduction)


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, bf16: bool, batch_size: int = 16) -> float:
    model.eval()
    total = 0.0
    for i in range(0, len(windows), batch_size):
        chunk = windows[i:i + batch_size]
        total += lm_loss(model, chunk, bf16).item() * len(chunk)
    model.train()
    return total / len(windows)


def save_final(model, args, state: dict, val_loss: float, tok_dir: Path) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.bfloat16)
    model.save_pretrained(args.out, safe_serialization=True)
    loop.save_files(args.out, tok_dir, bf16_config={"indent": 2, "sort_keys": True})
    state = {**state, "final_val_loss": val_loss}
    (args.out / "training_log.json").write_text(json.dumps(state, indent=1) + "\n")
    write_model_card(args, model, state)


def main(argv=None) -> None:
    args = parse_args(argv)
    bf16 = loop.setup(args)
    train = token_stream("train", args.tokenizer)
    val = val_windows(token_stream("validation", args.tokenizer), args.seq_len)
    periodic = spread(val, args.eval_windows)
    model = build_model(args)
    opt = loop.make_optimizer(model, args)
    ckpt_path = args.ckpt_dir / "last.pt"
    state = loop.new_state(args, "train_ar", train_loss=None, evals=[], train_tokens=len(train),
                           val_tokens=int(val[:, 1:].numel()))
    if args.resume:
        loop.resume(ckpt_path, model, opt, state, first_command=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model {n_params / 1e6:.2f}M params; train {len(train)} tokens, "
          f"val {len(val)} windows of {args.seq_len}; bf16 autocast={bf16}; threads={args.threads}")

    def step_loss(step):
        batch = sample_batch(train, args, step)
        return lm_loss(model, batch, bf16), {"tokens_seen": batch[:, 1:].numel()}

    def tokens_per_second(items: dict) -> dict:
        return {**items, "tok_s": f"{state['tokens_seen'] / max(state['elapsed_s'], 1e-9):.0f}"}

    if not loop.train(args, model, opt, state, ckpt_path, step_loss,
                      lambda: {"val_loss": round(evaluate(model, periodic, bf16), 4)},
                      postfix=tokens_per_second, report=False):
        return
    t0 = time.time()
    val_loss = evaluate(model, val, bf16)
    state["final_eval_s"] = round(time.time() - t0, 1)
    print(f"done: {state['step']} steps, {state['tokens_seen']} tokens, "
          f"{state['elapsed_s'] / 60:.1f} min; train loss (EMA) {state['train_loss']:.4f}, "
          f"full validation loss {val_loss:.4f} (ppl {math.exp(val_loss):.2f})")
    save_final(model, args, state, val_loss, args.tokenizer)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
