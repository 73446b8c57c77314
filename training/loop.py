"""The training loop shared by ``train_llada`` and ``train_asarm`` (same budget, schedule,
checkpoint and logging rules as ``train_ar`` / ``train_mdlm``).

* AdamW (betas 0.9/0.95, weight decay on matrices only), linear warmup then cosine to
  ``--min-lr-ratio``; progress = max(step / --max-steps, elapsed / --minutes), so the cosine
  ends exactly when the first budget runs out.
* ``step_loss(step) -> (loss, counters)``: the caller draws the batch of ``step`` from a
  generator seeded by (seed, step), so a resumed run sees the same batches.
* ``training/checkpoints/<name>/last.pt`` every ``--ckpt-every`` minutes, on Ctrl-C and at
  the end; ``--resume`` continues from it.
"""

from __future__ import annotations

import json
import math
import time

import torch
from tqdm import tqdm

from training.train_ar import lr_at, save_checkpoint


def add_loop_args(ap) -> None:
    a = ap.add_argument
    a("--lr", type=float, default=2e-3)
    a("--min-lr-ratio", type=float, default=0.1)
    a("--warmup", type=int, default=100)
    a("--weight-decay", type=float, default=0.1)
    a("--grad-clip", type=float, default=1.0)
    a("--minutes", type=float, default=None, help="wall-clock budget (training + evals)")
    a("--max-steps", type=int, default=None)
    a("--eval-every", type=int, default=250)
    a("--ckpt-every", type=float, default=3.0, help="minutes between checkpoints")
    a("--seed", type=int, default=0)
    a("--threads", type=int, default=1)
    a("--no-bf16", action="store_true", help="train in fp32 instead of bf16 autocast")
    a("--resume", action="store_true")


def make_optimizer(model, args):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), fused=False)


def resume(ckpt_path, model, opt, state: dict) -> None:
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ckpt.pop("model"))
        opt.load_state_dict(ckpt.pop("optim"))
        state.update({k: v for k, v in ckpt.items() if k not in ("args", "command")})
        print(f"resumed from {ckpt_path} at step {state['step']} ({state['elapsed_s']:.0f}s)")


def train(args, model, opt, state: dict, ckpt_path, step_loss, periodic_eval) -> bool:
    """Run until the budget is spent. ``step_loss(step) -> (loss tensor, {counter: int})``
    (counters are summed into ``state``); ``periodic_eval() -> dict`` is logged with the
    step every ``--eval-every`` steps. Returns False when interrupted (checkpoint saved)."""
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
            loss, counters = step_loss(step)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
            state.update(step=step + 1, train_loss=ema)
            for key, value in counters.items():
                state[key] = state.get(key, 0) + value
            if state["step"] % args.eval_every == 0:
                state["elapsed_s"] += time.time() - t_last
                t_last = time.time()
                model.eval()
                with torch.no_grad():
                    v = periodic_eval()
                model.train()
                state["evals"].append({"step": state["step"], "tokens": state["tokens_seen"],
                                       "elapsed_s": round(state["elapsed_s"], 1),
                                       "train_loss": round(ema, 4), **v})
                tqdm.write(json.dumps(state["evals"][-1]))
            now = time.time()
            state["elapsed_s"] += now - t_last
            t_last = now
            bar.update(1)
            bar.set_postfix(loss=f"{ema:.3f}", lr=f"{lr:.2e}", done=f"{progress():.0%}",
                            refresh=False)
            if now - t_ckpt > args.ckpt_every * 60:
                save_checkpoint(ckpt_path, model, opt, state)
                t_ckpt = time.time()
    except KeyboardInterrupt:
        save_checkpoint(ckpt_path, model, opt, state)
        print(f"\ninterrupted; checkpoint at step {state['step']} -> {ckpt_path} (use --resume)")
        return False
    bar.close()
    save_checkpoint(ckpt_path, model, opt, state)
    print(f"done: {state['step']} steps, {state['tokens_seen']} tokens, "
          f"{state['elapsed_s'] / 60:.1f} min; train loss (EMA) {ema:.4f}")
    return True
