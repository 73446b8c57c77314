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

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from training import loop  # noqa: E402
from training.windows import (  # noqa: E402
    random_windows, spread, step_generator, strided_windows)
from vllm_anyorder.model_executor.llada import LLaDAConfig, LLaDAModel, randomize_  # noqa: E402

EOS_ID, PAD_ID, MASK_ID = 0, 1, 2
NOISE_EPS = 1e-3
FORWARD = LLaDAModel.forward.__wrapped__  # the class's forward without its no_grad wrapper


def parse_args(argv=None):
    ap = loop.parser(__doc__, "llada-dllm")
    a = ap.add_argument
    loop.add_size_args(ap, mlp="--mlp")
    a("--length", type=int, default=128, help="window length L")
    a("--full-frac", type=float, default=0.25, help="pre-training rows (no clean prefix)")
    a("--min-prefix", type=int, default=8)
    a("--blocks", type=int, nargs="+", default=[16, 32], help="block lengths of continuation rows")
    return loop.parse_model_trainer(ap, argv, eval_windows=64)


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
    gen = step_generator(args.seed, step)
    return corrupt(random_windows(stream, args.length, args.batch_size, gen), gen, args)


def val_batches(stream, args, limit: int | None = None, batch_size: int = 16):
    """Non-overlapping validation windows, corrupted once with a fixed seed (1234)."""
    x = spread(strided_windows(stream, args.length), limit)
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


def step_loss(model, train, args, step: int, bf16: bool):
    batch = sample_batch(train, args, step)
    ce, weight, target = losses(model, batch, bf16)
    loss = (ce * weight).sum() / len(weight)
    return loss, {"tokens_seen": len(weight) * args.length,
                  "masked_tokens_seen": int((target >= 0).sum())}


def main(argv=None) -> None:
    from training.eval_llada import final_checks

    args = parse_args(argv)
    state = loop.train_then_check(args, "train_llada", build_model, val_batches, step_loss,
                                  evaluate, final_checks, counter="masked_tokens_seen")
    if args.eval_only is not None:
        print(json.dumps(state, indent=1))


if __name__ == "__main__":
    main()
