"""Trains a small Llama-architecture causal LM on the stdlib corpus, on one CPU core.

Owns the autoregressive models of the project: ``models/ar-target/`` (defaults)
and ``models/ar-drafter/`` (same script, smaller sizes; see training/README.md).

Data: the train split of ``training.data`` tokenised with ``models/tokenizer``,
each file preceded by ``<|endoftext|>`` and concatenated into one stream; every
step draws ``--batch-size`` random windows of ``--seq-len + 1`` tokens from it
with a generator seeded by (seed, step), so a resumed run sees the same batches.
Validation loss is measured on non-overlapping windows of the validation split:
a fixed subset every ``--eval-every`` steps, all of them at the end.

Schedule: AdamW, linear warmup then cosine decay to ``--min-lr-ratio`` of the
peak. Progress is max(step / --max-steps, elapsed / --minutes), so the cosine
ends exactly when the first of the two budgets runs out. Checkpoints (model,
optimizer, step, elapsed time, log) go to ``training/checkpoints/<name>/last.pt``
every ``--ckpt-every`` minutes, on Ctrl-C and at the end; ``--resume`` continues.

The result is saved in bf16 safetensors with a copy of the tokenizer, a
``training_log.json`` and a ``MODEL_CARD.md`` (see ``training.model_card``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from tqdm import tqdm  # noqa: E402

from training.data import DEFAULT_TOKENIZER, REPO_ROOT, load_split  # noqa: E402
from training.model_card import write_model_card  # noqa: E402

EOS_ID, PAD_ID = 0, 1


def _rel(value):
    """JSON-friendly argument value; paths relative to the repository when inside it."""
    if isinstance(value, Path):
        value = value.resolve()
        return str(value.relative_to(REPO_ROOT)) if value.is_relative_to(REPO_ROOT) else str(value)
    return value


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a = ap.add_argument
    a("--out", type=Path, default=REPO_ROOT / "models" / "ar-target")
    a("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    a("--ckpt-dir", type=Path, default=None, help="default training/checkpoints/<out name>")
    a("--hidden", type=int, default=256)
    a("--layers", type=int, default=4)
    a("--heads", type=int, default=4)
    a("--kv-heads", type=int, default=None, help="default: --heads")
    a("--intermediate", type=int, default=768)
    a("--max-positions", type=int, default=1024)
    a("--rope-theta", type=float, default=10000.0)
    a("--seq-len", type=int, default=256)
    a("--batch-size", type=int, default=8)
    a("--lr", type=float, default=2e-3)
    a("--min-lr-ratio", type=float, default=0.1)
    a("--warmup", type=int, default=100, help="warmup steps")
    a("--weight-decay", type=float, default=0.1)
    a("--grad-clip", type=float, default=1.0)
    a("--minutes", type=float, default=None, help="wall-clock budget (training + evals)")
    a("--max-steps", type=int, default=None)
    a("--eval-every", type=int, default=200)
    a("--eval-windows", type=int, default=48, help="validation windows per periodic eval")
    a("--ckpt-every", type=float, default=3.0, help="minutes between checkpoints")
    a("--seed", type=int, default=0)
    a("--threads", type=int, default=1)
    a("--no-bf16", action="store_true", help="train in fp32 instead of bf16 autocast")
    a("--resume", action="store_true")
    args = ap.parse_args(argv)
    if args.minutes is None and args.max_steps is None:
        ap.error("give --minutes and/or --max-steps")
    args.kv_heads = args.kv_heads or args.heads
    head_dim = args.hidden // args.heads
    if head_dim * args.heads != args.hidden or head_dim < 32:
        ap.error(f"hidden/heads must divide evenly into head_dim >= 32 (vLLM CPU), got {head_dim}")
    args.ckpt_dir = args.ckpt_dir or REPO_ROOT / "training" / "checkpoints" / args.out.name
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


def token_stream(split: str, tokenizer_path: Path) -> torch.Tensor:
    """One int16 tensor: ``<|endoftext|>`` + tokens of each file of ``split``."""
    tok = Tokenizer.from_file(str(tokenizer_path / "tokenizer.json"))
    ids: list[int] = []
    for enc in tok.encode_batch(load_split(split), add_special_tokens=False):
        ids.append(EOS_ID)
        ids.extend(enc.ids)
    return torch.tensor(ids, dtype=torch.int16)


def sample_batch(stream: torch.Tensor, args, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    starts = torch.randint(0, len(stream) - args.seq_len - 1, (args.batch_size,), generator=g)
    return torch.stack([stream[s:s + args.seq_len + 1] for s in starts.tolist()]).long()


def val_windows(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    n = (len(stream) - 1) // seq_len
    return torch.stack([stream[i * seq_len:i * seq_len + seq_len + 1] for i in range(n)]).long()


def lm_loss(model, batch: torch.Tensor, bf16: bool) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, bf16: bool, batch_size: int = 16) -> float:
    model.eval()
    total = 0.0
    for i in range(0, len(windows), batch_size):
        chunk = windows[i:i + batch_size]
        total += lm_loss(model, chunk, bf16).item() * len(chunk)
    model.train()
    return total / len(windows)


def lr_at(args, step: int, progress: float) -> float:
    warm = min(1.0, (step + 1) / args.warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return args.lr * warm * (args.min_lr_ratio + (1 - args.min_lr_ratio) * cosine)


def save_checkpoint(path: Path, model, opt, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), **state}, tmp)
    os.replace(tmp, path)


def save_final(model, args, state: dict, val_loss: float, tok_dir: Path) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.bfloat16)
    model.save_pretrained(args.out, safe_serialization=True)
    os.chmod(args.out / "model.safetensors", 0o644)  # written 0600 via a temporary file
    config_path = args.out / "config.json"  # transformers 5 writes only "dtype";
    config = json.loads(config_path.read_text())  # older readers look for "torch_dtype"
    config["torch_dtype"] = "bfloat16"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tok_dir / name, args.out / name)
    state = {**state, "final_val_loss": val_loss}
    (args.out / "training_log.json").write_text(json.dumps(state, indent=1) + "\n")
    write_model_card(args, model, state)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(args.threads)
    torch.manual_seed(args.seed)
    bf16 = not args.no_bf16

    train = token_stream("train", args.tokenizer)
    val = val_windows(token_stream("validation", args.tokenizer), args.seq_len)
    periodic = val[torch.linspace(0, len(val) - 1, min(args.eval_windows, len(val))).long()]
    model = build_model(args)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=False)
    ckpt_path = args.ckpt_dir / "last.pt"
    state = {"step": 0, "elapsed_s": 0.0, "tokens_seen": 0, "train_loss": None, "evals": [],
             "train_tokens": len(train), "val_tokens": int(val[:, 1:].numel()),
             "args": {k: _rel(v) for k, v in vars(args).items()},
             "command": "python -m training.train_ar " + shlex.join(sys.argv[1:])}
    if args.resume and ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ckpt.pop("model"))
        opt.load_state_dict(ckpt.pop("optim"))
        state.update({k: v for k, v in ckpt.items() if k != "args"})
        print(f"resumed from {ckpt_path} at step {state['step']} ({state['elapsed_s']:.0f}s)")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model {n_params / 1e6:.2f}M params; train {len(train)} tokens, "
          f"val {len(val)} windows of {args.seq_len}; bf16 autocast={bf16}; threads={args.threads}")

    budget_s = args.minutes * 60 if args.minutes else math.inf
    max_steps = args.max_steps or math.inf

    def progress() -> float:
        return max(state["step"] / max_steps, state["elapsed_s"] / budget_s)

    bar = tqdm(total=args.max_steps, initial=state["step"], mininterval=10, dynamic_ncols=True)
    t_last, t_ckpt, ema = time.time(), time.time(), state["train_loss"]
    model.train()
    try:
        while progress() < 1.0:
            step = state["step"]
            lr = lr_at(args, step, progress())
            for group in opt.param_groups:
                group["lr"] = lr
            batch = sample_batch(train, args, step)
            loss = lm_loss(model, batch, bf16)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
            state.update(step=step + 1, tokens_seen=state["tokens_seen"] + batch[:, 1:].numel(),
                         train_loss=ema)
            if state["step"] % args.eval_every == 0:
                state["elapsed_s"] += time.time() - t_last
                t_last = time.time()
                v = evaluate(model, periodic, bf16)
                state["evals"].append({"step": state["step"], "tokens": state["tokens_seen"],
                                       "elapsed_s": round(state["elapsed_s"], 1),
                                       "train_loss": round(ema, 4), "val_loss": round(v, 4)})
                tqdm.write(json.dumps(state["evals"][-1]))
            now = time.time()
            state["elapsed_s"] += now - t_last
            t_last = now
            bar.update(1)
            bar.set_postfix(loss=f"{ema:.3f}", lr=f"{lr:.2e}", done=f"{progress():.0%}",
                            tok_s=f"{state['tokens_seen'] / max(state['elapsed_s'], 1e-9):.0f}",
                            refresh=False)
            if now - t_ckpt > args.ckpt_every * 60:
                save_checkpoint(ckpt_path, model, opt, state)
                t_ckpt = time.time()
    except KeyboardInterrupt:
        save_checkpoint(ckpt_path, model, opt, state)
        print(f"\ninterrupted; checkpoint at step {state['step']} -> {ckpt_path} (use --resume)")
        return
    bar.close()
    save_checkpoint(ckpt_path, model, opt, state)
    t0 = time.time()
    val_loss = evaluate(model, val, bf16)
    state["final_eval_s"] = round(time.time() - t0, 1)
    print(f"done: {state['step']} steps, {state['tokens_seen']} tokens, "
          f"{state['elapsed_s'] / 60:.1f} min; train loss (EMA) {ema:.4f}, "
          f"full validation loss {val_loss:.4f} (ppl {math.exp(val_loss):.2f})")
    save_final(model, args, state, val_loss, args.tokenizer)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
