"""Trains the LLaDA-format diffusion LLM of ``method="ssd"`` / ``"freedave"`` on one CPU core.

Owns ``models/llada-dllm/``: a small bidirectional masked-diffusion LM in the released LLaDA
format (``vllm_anyorder.model_executor.llada``: ``model_type "llada"``, ``model.transformer.``
names), over the project tokenizer's 4096 tokens; the mask is the tokenizer's own
``<|mask|>`` (id 2, ``mask_token_id`` in config.json; LLaDA-8B's 126336 is only that
release's value), EOS / file separator ``<|endoftext|>`` = 0. Saved in bf16.

Objective: LLaDA's (Nie et al. 2025, Eq. 3 pre-training, Eq. 5 SFT): draw t ~ U(0, 1] (as
p = (1 - 1e-3) u + 1e-3), mask each token independently with probability p, cross-entropy on
the masked tokens only, each weighted 1/p, normalised by the number of tokens in the noised
part. Two kinds of rows, ``--full-frac`` of the batch the first:

* full rows -- pre-training: a ``--length``-token window, every token may be masked, full
  bidirectional attention (what ``cache="none"`` decoding sees);
* continuation rows -- SFT-style: a clean prefix of P ~ U{``--min-prefix``..L - 16} tokens is
  never masked; the continuation is cut into blocks of B (``--blocks``, drawn per row) and
  each block is masked at its own rate p_b. Attention is block-causal, exactly what the
  engine's block decoding sees (``core.dllm_cache``, ``prefix`` policy: the prompt attends to
  itself, a block to the prompt, the committed blocks before it and itself). To get every
  block's loss from one forward the row carries the clean window *and* a noised copy of the
  continuation at the same positions (as block-diffusion training does): noised block b
  attends to the clean prefix, the clean blocks < b and noised block b; clean rows attend
  block-causally among themselves and carry no loss.

Data, schedule, checkpoints and budgets: ``training.loop`` (as ``train_ar``). At the end the
bf16 model is saved, reloaded and evaluated (``training.eval_llada``): validation loss per
row kind, a greedy block-decoding sample, and tokens per forward of ``ssd`` / ``freedave``
against ``stepwise`` in the engine-free core, written into ``MODEL_CARD.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from training import loop  # noqa: E402
from training.data import DEFAULT_TOKENIZER, REPO_ROOT  # noqa: E402
from training.train_ar import _rel, token_stream  # noqa: E402
from vllm_anyorder.model_executor.llada import LLaDAConfig, LLaDAModel, randomize_  # noqa: E402

EOS_ID, PAD_ID, MASK_ID = 0, 1, 2
NOISE_EPS = 1e-3
FORWARD = LLaDAModel.forward.__wrapped__  # the class's forward without its no_grad wrapper


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a = ap.add_argument
    a("--out", type=Path, default=REPO_ROOT / "models" / "llada-dllm")
    a("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    a("--ckpt-dir", type=Path, default=None, help="default training/checkpoints/<out name>")
    a("--hidden", type=int, default=256)
    a("--layers", type=int, default=4)
    a("--heads", type=int, default=4)
    a("--mlp", type=int, default=768)
    a("--length", type=int, default=128, help="window length L")
    a("--full-frac", type=float, default=0.25, help="pre-training rows (no clean prefix)")
    a("--min-prefix", type=int, default=8)
    a("--blocks", type=int, nargs="+", default=[16, 32], help="block lengths of continuation rows")
    a("--batch-size", type=int, default=8)
    a("--eval-windows", type=int, default=64)
    a("--eval-only", type=Path, default=None, help="only evaluate this saved model")
    loop.add_loop_args(ap)
    args = ap.parse_args(argv)
    if args.eval_only is None and args.minutes is None and args.max_steps is None:
        ap.error("give --minutes and/or --max-steps")
    if args.hidden % args.heads or args.hidden // args.heads < 32:
        ap.error("hidden/heads must divide into head_dim >= 32 (vLLM CPU attention)")
    args.ckpt_dir = args.ckpt_dir or REPO_ROOT / "training" / "checkpoints" / args.out.name
    return args


def build_model(args) -> LLaDAModel:
    config = LLaDAConfig(
        d_model=args.hidden, n_heads=args.heads, n_kv_heads=args.heads, n_layers=args.layers,
        mlp_hidden_size=args.mlp, vocab_size=4096, embedding_size=4096,
        max_sequence_length=1024, rope_theta=10000.0, mask_token_id=MASK_ID,
        eos_token_id=EOS_ID, pad_token_id=PAD_ID, weight_tying=True,
        extra={"torch_dtype": "bfloat16"})
    model = LLaDAModel(config)
    randomize_(model, args.seed, std=0.02)
    return model


# ---------------------------------------------------------------------------- corruption
def _rate(n: int, gen) -> torch.Tensor:
    return (1 - NOISE_EPS) * torch.rand(n, generator=gen) + NOISE_EPS


def _mask(p: torch.Tensor, gen) -> torch.Tensor:
    m = torch.rand(len(p), generator=gen) < p
    m[int(torch.randint(len(p), (1,), generator=gen))] = True  # at least one masked token
    return m


def full_row(x, gen):
    """Pre-training row: tokens, positions, attention [n, n], targets, weights, noise rate."""
    n = len(x)
    p = _rate(1, gen).expand(n)
    m = _mask(p, gen)
    return (x.masked_fill(m, MASK_ID), torch.arange(n), torch.ones(n, n, dtype=torch.bool),
            x.masked_fill(~m, -100), m / (p * n))


def continuation_row(x, gen, args):
    """SFT-style row: clean window + noised copy of the continuation (module docstring)."""
    n = len(x)
    prefix = int(torch.randint(args.min_prefix, n - 16 + 1, (1,), generator=gen))
    blen = args.blocks[int(torch.randint(len(args.blocks), (1,), generator=gen))]
    g = n - prefix
    blk_noisy = torch.arange(g) // blen
    blk_clean = torch.cat([torch.full((prefix,), -1), blk_noisy])
    p = _rate(int(blk_noisy[-1]) + 1, gen)[blk_noisy]
    m = _mask(p, gen)
    cont = x[prefix:]
    top = torch.cat([blk_clean[None] <= blk_clean[:, None], torch.zeros(n, g, dtype=torch.bool)], 1)
    bottom = torch.cat([blk_clean[None] < blk_noisy[:, None], blk_noisy[None] == blk_noisy[:, None]], 1)
    return (torch.cat([x, cont.masked_fill(m, MASK_ID)]),
            torch.cat([torch.arange(n), torch.arange(prefix, n)]), torch.cat([top, bottom]),
            torch.cat([torch.full((n,), -100), cont.masked_fill(~m, -100)]),
            torch.cat([torch.zeros(n), m / (p * g)]))


def collate(rows):
    """Pad rows to one width: padding rows are masks that attend to themselves only."""
    w = max(len(r[0]) for r in rows)
    b = len(rows)
    tokens = torch.full((b, w), MASK_ID)
    pos = torch.zeros((b, w), dtype=torch.long)
    attn = torch.eye(w, dtype=torch.bool).repeat(b, 1, 1)
    target = torch.full((b, w), -100)
    weight = torch.zeros((b, w))
    for i, (t, ps, a, tg, wt) in enumerate(rows):
        n = len(t)
        tokens[i, :n], pos[i, :n], attn[i, :n, :n], target[i, :n], weight[i, :n] = t, ps, a, tg, wt
    return tokens, pos, attn, target, weight


def corrupt(windows, gen, args):
    full = torch.rand(len(windows), generator=gen) < args.full_frac
    rows = [full_row(x, gen) if f else continuation_row(x, gen, args)
            for x, f in zip(windows, full.tolist())]
    return (*collate(rows), full)


def losses(model, batch, bf16: bool):
    """Per-token (ce [B, W], loss-weight [B, W], target [B, W]) of one corrupted batch."""
    tokens, pos, attn, target, weight, _ = batch
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits, _ = FORWARD(model, tokens, pos, None, attn)
    ce = F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), ignore_index=-100,
                         reduction="none").view(target.shape)
    return ce, weight, target


def sample_batch(stream, args, step: int):
    gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    starts = torch.randint(0, len(stream) - args.length, (args.batch_size,), generator=gen)
    x = torch.stack([stream[s:s + args.length] for s in starts.tolist()]).long()
    return corrupt(x, gen, args)


def val_batches(stream, args, limit: int | None = None, batch_size: int = 16):
    """Non-overlapping validation windows, corrupted once with a fixed seed (1234)."""
    n = len(stream) // args.length
    x = stream[: n * args.length].view(n, args.length).long()
    if limit is not None and limit < n:
        x = x[torch.linspace(0, n - 1, limit).long()]
    gen = torch.Generator().manual_seed(1234)
    return [corrupt(x[i:i + batch_size], gen, args) for i in range(0, len(x), batch_size)]


@torch.no_grad()
def evaluate(model, batches, bf16: bool) -> dict:
    """Per row kind: ``*_ce`` nats per masked token, ``*_bound`` the 1/t-weighted loss
    (LLaDA's bound on the negative log-likelihood, nats per token of the noised part)."""
    acc = {k: [0.0, 0, 0.0, 0] for k in ("full", "cont")}
    for batch in batches:
        ce, weight, target = losses(model, batch, bf16)
        for row, is_full in enumerate(batch[-1].tolist()):
            a = acc["full" if is_full else "cont"]
            m = target[row] >= 0
            a[0] += ce[row][m].sum().item()
            a[1] += int(m.sum())
            a[2] += (ce[row] * weight[row]).sum().item()
            a[3] += 1
    out = {}
    for kind, (ce_sum, n_masked, bound_sum, n_rows) in acc.items():
        out[f"val_{kind}_ce"] = round(ce_sum / max(n_masked, 1), 4)
        out[f"val_{kind}_bound"] = round(bound_sum / max(n_rows, 1), 4)
    return out


def main(argv=None) -> None:
    from training.eval_llada import final_checks

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(args.threads)
    torch.manual_seed(args.seed)
    bf16 = not args.no_bf16
    val_stream = token_stream("validation", args.tokenizer)
    if args.eval_only is not None:
        state = {}
        final_checks(args.eval_only, args, val_batches(val_stream, args), state)
        print(json.dumps(state, indent=1))
        return
    train = token_stream("train", args.tokenizer)
    model = build_model(args)
    periodic = val_batches(val_stream, args, limit=args.eval_windows)
    opt = loop.make_optimizer(model, args)
    ckpt_path = args.ckpt_dir / "last.pt"
    state = {"step": 0, "elapsed_s": 0.0, "tokens_seen": 0, "masked_tokens_seen": 0,
             "train_loss": None, "evals": [], "train_tokens": len(train),
             "val_tokens": len(val_stream), "args": {k: _rel(v) for k, v in vars(args).items()},
             "command": "python -m training.train_llada " + shlex.join(sys.argv[1:])}
    if args.resume:
        loop.resume(ckpt_path, model, opt, state)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model {n_params / 1e6:.2f}M params; train {len(train)} tokens; bf16 autocast={bf16}")

    def step_loss(step):
        batch = sample_batch(train, args, step)
        ce, weight, target = losses(model, batch, bf16)
        loss = (ce * weight).sum() / len(weight)
        return loss, {"tokens_seen": len(weight) * args.length,
                      "masked_tokens_seen": int((target >= 0).sum())}

    if not loop.train(args, model, opt, state, ckpt_path, step_loss,
                      lambda: evaluate(model, periodic, bf16)):
        return
    model = model.to(torch.bfloat16).eval()
    model.save_pretrained(args.out)
    os.chmod(args.out / "model.safetensors", 0o644)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(args.tokenizer / name, args.out / name)
    final_checks(args.out, args, val_batches(val_stream, args), state)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
