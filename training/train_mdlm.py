"""Trains the MDLM-format masked-diffusion drafter of ``method="specdiff"`` on one CPU core.

Owns ``models/mdlm-drafter/``: a small DiT in the released MDLM layout
(``vllm_anyorder.model_executor.masked_diffusion``; ``time_conditioning`` false), over the
project tokenizer's 4096 tokens plus the mask row 4096 (vocab_size 4097), saved as bf16.

Objective (MDLM, Sahoo et al. 2024, SUBS parameterisation: the mask column is never predicted
and unmasked tokens carry over, so only masked positions have a loss). The drafter's job at
inference is to fill gamma (8..32) masks after a clean context of up to max_length - gamma
tokens, so most rows train on that shape:

* suffix rows (1 - ``--full-frac``): a window of ``--max-length`` tokens, a suffix of
  g ~ U{``--min-suffix``..``--max-suffix``} tokens at its end, each suffix token masked with
  probability t ~ U(1e-3, 1) (at least one); with probability ``--short-frac`` the row is cut
  to a random shorter length first (padding keys excluded), as at the start of a generation;
* full rows (``--full-frac``, default 50%): MDLM masking of the whole window at a low rate
  t ~ U(1e-3, ``--full-max-rate`` = 0.3). On one CPU core for ~15 minutes the model is still
  in the early plateau of masked-LM training, where it must learn to route neighbouring
  tokens through attention before it beats the unigram distribution; rows whose masks have
  visible neighbours teach that fastest (BERT-like rates). In 1000-step ablations (hidden
  128, batch 8) this mixture reached a next-token CE of 6.24 nats against 6.40-6.53 for 25%
  or 75% full rows at t ~ U(0, 1), per-row (ELBO-like) weighting, other learning rates, or
  other initialisations; the suffix rows keep t ~ U(1e-3, 1), the rates drafting meets.

Loss: cross-entropy over the real tokens at masked positions, averaged over masked tokens.
MDLM's continuous-time ELBO weights each masked token by 1/t; that weight is dropped here
(as in MaskGIT-style training): the drafter is used for its per-position denoising
distribution, not as a likelihood model, and the 1/t weight would put most of the gradient on
the rare low-t rows with one or two masks, adding variance without helping drafting at the
high mask rates that decoding starts from (``--weighting row``, each row's masked mean, which
is the ELBO weighting's effect in expectation, trained no faster in a 1000-step ablation).

Data, schedule, checkpoints and budgets as in ``training.train_ar`` (``training.loop``):
seeded batches that depend only on (seed, step), AdamW with warmup + cosine ending when the
first of ``--minutes`` / ``--max-steps`` runs out, ``training/checkpoints/<name>/last.pt``
every ``--ckpt-every`` minutes, on Ctrl-C and at the end (``--resume``). At the end the bf16
model is saved, reloaded from disk and evaluated: validation loss on every validation window
and greedy drafting accuracy (``--eval-only DIR`` runs just those checks on a saved drafter).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from training import loop  # noqa: E402
from training.data import REPO_ROOT  # noqa: E402
from training.windows import (  # noqa: E402
    random_windows, spread, step_generator, strided_windows, token_stream)
from vllm_anyorder.model_executor.masked_diffusion import (  # noqa: E402
    load_drafter, mdlm_spec, random_drafter, save_drafter)

NOISE_EPS = 1e-3


def parse_args(argv=None):
    ap = loop.parser(__doc__, "mdlm-drafter")
    a = ap.add_argument
    a("--hidden", type=int, default=128)
    a("--cond-dim", type=int, default=64)
    a("--blocks", type=int, default=4)
    a("--heads", type=int, default=4)
    a("--max-length", type=int, default=128)
    a("--min-suffix", type=int, default=8)
    a("--max-suffix", type=int, default=48)
    a("--full-frac", type=float, default=0.5, help="rows with whole-window masking")
    a("--short-frac", type=float, default=0.2, help="suffix rows cut to a shorter length")
    a("--full-max-rate", type=float, default=0.3, help="full rows: t ~ U(1e-3, this)")
    a("--weighting", choices=("token", "row"), default="token",
      help="loss: mean over masked tokens, or mean over rows of each row's masked mean")
    a("--batch-size", type=int, default=8)
    a("--draft-windows", type=int, default=256, help="contexts for the drafting check")
    a("--eval-only", type=Path, default=None, help="only evaluate this saved drafter")
    loop.add_loop_args(ap, eval_every=500, eval_windows=96)
    args = loop.parse(ap, argv, no_budget_with="eval_only")
    head_dim = args.hidden // args.heads
    if head_dim * args.heads != args.hidden or head_dim < 32 or head_dim % 2:
        ap.error(f"hidden/heads must divide into an even head_dim >= 32, got {args.hidden}/{args.heads}")
    if not 1 <= args.min_suffix <= args.max_suffix < args.max_length - 8:
        ap.error("need 1 <= --min-suffix <= --max-suffix < --max-length - 8")
    return args


def build_model(args, vocab_tokens: int):
    """fp32 model for training; DiT/MDLM init: adaLN and output projection start at zero."""
    spec = mdlm_spec(vocab_tokens + 1, args.hidden, args.cond_dim, args.blocks, args.heads,
                     args.max_length, time_conditioning=False)
    model = random_drafter(spec, seed=args.seed, init_std=0.02)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "adaLN_modulation" in name or name.startswith("dit.output_layer.linear"):
                p.zero_()
    return model


# ---------------------------------------------------------------------------- corruption
def corrupt(x: torch.Tensor, gen: torch.Generator, args, mask_id: int):
    """Noisy input, masked positions, key mask and per-row ``full`` flags for clean windows
    ``x`` [B, L] (the module docstring describes the mixture)."""
    b, length = x.shape
    col = torch.arange(length)[None, :]
    full = torch.rand(b, generator=gen) < args.full_frac
    gam = torch.randint(args.min_suffix, args.max_suffix + 1, (b,), generator=gen)
    short = (torch.rand(b, generator=gen) < args.short_frac) & ~full
    room = length - gam - 8  # a cut row keeps at least 8 context tokens
    cut = gam + 8 + (torch.rand(b, generator=gen) * (room + 1)).long().clamp(max=room)
    end = torch.where(short, cut, torch.full_like(gam, length))
    start = torch.where(full, torch.zeros_like(gam), end - gam)
    top = torch.where(full, torch.full((b,), args.full_max_rate), torch.ones(b))
    t = NOISE_EPS + (top - NOISE_EPS) * torch.rand(b, generator=gen)
    zone = (col >= start[:, None]) & (col < end[:, None])
    masked = zone & (torch.rand(b, length, generator=gen) < t[:, None])
    forced = start + (torch.rand(b, generator=gen) * (end - start)).long().clamp(max=end - start - 1)
    masked[torch.arange(b), forced] = True  # at least one mask per row
    key_mask = col < end[:, None]
    return x.masked_fill(masked, mask_id), masked, key_mask, full


def masked_ce(model, x, noisy, masked, key_mask, bf16: bool, reduction="mean"):
    n = model.spec.num_tokens
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(noisy, torch.zeros(len(x)), key_mask, positions=masked)
    return F.cross_entropy(logits[:, :n].float(), x[masked], reduction=reduction)


def train_loss(model, x, noisy, masked, key_mask, bf16: bool, weighting: str):
    if weighting == "token":
        return masked_ce(model, x, noisy, masked, key_mask, bf16)
    ce = masked_ce(model, x, noisy, masked, key_mask, bf16, reduction="none")
    rows = masked.nonzero()[:, 0]
    per_row = torch.zeros(len(x)).index_add_(0, rows, ce) / masked.sum(1).clamp(min=1)
    return per_row.mean()


def sample_batch(stream, args, step: int, mask_id: int):
    gen = step_generator(args.seed, step)
    x = random_windows(stream, args.max_length, args.batch_size, gen)
    return (x, *corrupt(x, gen, args, mask_id))


def val_set(stream, args, mask_id: int, limit: int | None = None):
    """Non-overlapping validation windows with a fixed corruption (seed 1234)."""
    x = spread(strided_windows(stream, args.max_length), limit)
    return (x, *corrupt(x, torch.Generator().manual_seed(1234), args, mask_id))


@torch.no_grad()
def evaluate(model, vs, bf16: bool, batch_size: int = 32) -> dict:
    """nats per masked token: overall, suffix rows, full rows."""
    was_training = model.training
    model.eval()
    sums = {"all": [0.0, 0], "suffix": [0.0, 0], "full": [0.0, 0]}
    x, noisy, masked, key_mask, full = vs
    for i in range(0, len(x), batch_size):
        sl = slice(i, i + batch_size)
        ce = masked_ce(model, x[sl], noisy[sl], masked[sl], key_mask[sl], bf16, reduction="none")
        row = masked[sl].nonzero()[:, 0]
        for key, sel in (("all", torch.ones_like(row, dtype=torch.bool)),
                         ("suffix", ~full[sl][row]), ("full", full[sl][row])):
            sums[key][0] += ce[sel].sum().item()
            sums[key][1] += int(sel.sum())
    model.train(was_training)
    return {k: round(s / max(c, 1), 4) for k, (s, c) in sums.items()}


@torch.no_grad()
def drafting_check(model, stream, n_windows: int, context: int = 96, gamma: int = 8,
                   steps: int = 8, target_dir: Path | None = None) -> dict:
    """Greedy drafts of ``gamma`` tokens after ``context``-token validation contexts with
    ``steps`` confidence-ordered unmasking steps (the engine's ``core.specdiff.draft``).
    Accuracy = fraction of drafted positions equal to the true next token; prefix = mean
    length of the correct prefix. With ``target_dir`` also against the AR target's greedy
    continuation (what speculative decoding accepts at temperature 0)."""
    from vllm_anyorder.core.specdiff import SpecDiffSettings, draft

    width = context + gamma
    total = len(stream) // width
    n = min(n_windows, total)
    every = stream[: total * width].view(total, width)
    windows = every[torch.linspace(0, total - 1, n).long()].long()
    settings = SpecDiffSettings(num_draft_tokens=gamma, steps=steps, context_window=context)
    model.eval()
    drafts = []
    for i in range(0, n, 16):
        ctx = windows[i:i + 16, :context].tolist()
        out, _ = draft(model.token_logits, ctx, settings, model.spec.mask_token_id)
        drafts.append(torch.tensor(out))
    drafts = torch.cat(drafts)
    refs = {"text": windows[:, context:]}
    if target_dir is not None and (target_dir / "config.json").exists():
        from transformers import AutoModelForCausalLM

        target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.bfloat16).eval()
        outs = [target.generate(windows[i:i + 32, :context], max_new_tokens=gamma, do_sample=False,
                                min_new_tokens=gamma, pad_token_id=1)[:, context:]
                for i in range(0, n, 32)]
        refs["ar_target"] = torch.cat(outs)
    result = {"contexts": n, "context_tokens": context, "gamma": gamma, "steps": steps,
              "schedule": "confidence"}
    for name, ref in refs.items():
        eq = drafts == ref
        result[f"acc_vs_{name}"] = round(eq.float().mean().item(), 4)
        result[f"prefix_vs_{name}"] = round(eq.long().cumprod(dim=1).sum(dim=1).float().mean().item(), 3)
    return result


def final_checks(path: Path, args, val_stream, state: dict) -> None:
    """Reload the saved bf16 drafter and measure what ships."""
    t0 = time.time()
    model = load_drafter(path)
    mask_id = model.spec.mask_token_id
    state["final_val"] = evaluate(model, val_set(val_stream, args, mask_id), bf16=False)
    state["final_val_loss"] = state["final_val"]["all"]
    state["drafting"] = drafting_check(model, val_stream, args.draft_windows,
                                       target_dir=REPO_ROOT / "models" / "ar-target")
    state["final_eval_s"] = round(time.time() - t0, 1)
    print("validation (saved bf16 model, all windows):", json.dumps(state["final_val"]))
    print("drafting check:", json.dumps(state["drafting"]))


def save_final(model, args, state: dict, val_stream) -> None:
    from training.model_card import write_drafter_card

    save_drafter(model.to(torch.bfloat16).eval(), args.out)
    loop.copy_tokenizer(args.tokenizer, args.out)
    final_checks(args.out, args, val_stream, state)
    (args.out / "training_log.json").write_text(json.dumps(state, indent=1) + "\n")
    write_drafter_card(args, load_drafter(args.out), state)


def main(argv=None) -> None:
    args = parse_args(argv)
    bf16 = loop.setup(args)
    val_stream = token_stream("validation", args.tokenizer)
    if args.eval_only is not None:
        state: dict = {}
        final_checks(args.eval_only, args, val_stream, state)
        return
    train = token_stream("train", args.tokenizer)
    from tokenizers import Tokenizer
    vocab = Tokenizer.from_file(str(args.tokenizer / "tokenizer.json")).get_vocab_size()
    model = build_model(args, vocab)
    mask_id = model.spec.mask_token_id
    periodic = val_set(val_stream, args, mask_id, limit=args.eval_windows)
    opt = loop.make_optimizer(model, args)
    ckpt_path = args.ckpt_dir / "last.pt"
    state = loop.new_state(args, "train_mdlm", masked_tokens_seen=0, train_loss=None, evals=[],
                           train_tokens=len(train), val_tokens=len(val_stream))
    if args.resume:
        loop.resume(ckpt_path, model, opt, state)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model {n_params / 1e6:.2f}M params (vocab {model.spec.vocab_size}, mask id {mask_id}); "
          f"train {len(train)} tokens; bf16 autocast={bf16}; threads={args.threads}")

    def step_loss(step):
        x, noisy, masked, key_mask, _ = sample_batch(train, args, step, mask_id)
        loss = train_loss(model, x, noisy, masked, key_mask, bf16, args.weighting)
        return loss, {"tokens_seen": int(key_mask.sum()), "masked_tokens_seen": int(masked.sum())}

    def periodic_eval() -> dict:
        v = evaluate(model, periodic, bf16)
        return {"val_loss": v["all"], "val_suffix": v["suffix"], "val_full": v["full"]}

    if not loop.train(args, model, opt, state, ckpt_path, step_loss, periodic_eval, report=False):
        return
    print(f"done: {state['step']} steps, {state['tokens_seen']} tokens "
          f"({state['masked_tokens_seen']} masked), {state['elapsed_s'] / 60:.1f} min; "
          f"train loss (EMA) {state['train_loss']:.4f}")
    save_final(model, args, state, val_stream)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
