"""The training machinery every trainer shares (``train_ar``, ``train_mdlm``, ``train_jacobi``,
``train_llada``, ``train_asarm``): each script keeps only its model, objective and outputs.

* Command line: ``parser`` (``--out``, ``--tokenizer``, ``--ckpt-dir``), ``add_size_args``,
  ``add_loop_args`` (optimiser, budgets, evaluation, checkpoints, seed, threads, bf16,
  ``--resume``) and ``parse`` (a budget is required; ``--ckpt-dir`` defaults to
  ``training/checkpoints/<out name>``).
* AdamW (betas 0.9/0.95, weight decay on matrices only), linear warmup then cosine to
  ``--min-lr-ratio``; progress = max(step / --max-steps, elapsed / --minutes), so the cosine
  ends exactly when the first budget runs out.
* ``train``: ``step_loss(step) -> (loss, counters[, averages])``: the caller draws the batch
  of ``step`` from ``windows.step_generator(seed, step)``, so a resumed run sees the same
  batches.
* ``training/checkpoints/<name>/last.pt`` every ``--ckpt-every`` minutes, on Ctrl-C and at
  the end; ``--resume`` continues from it.
* ``save_files``: what every saved model directory gets besides its weights.
* ``train_then_check``: the whole ``main`` of ``train_llada`` and ``train_asarm`` (their
  saved model is reloaded and checked by ``eval_llada`` / ``eval_asarm``).
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

import torch
from tqdm import tqdm

from training.data import DEFAULT_TOKENIZER, REPO_ROOT
from training.windows import token_stream

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


# ----------------------------------------------------------------------------- command line
def parser(doc: str, out: str, *, tokenizer: bool = True) -> argparse.ArgumentParser:
    """A trainer's parser: described by the first paragraph of its docstring, ``--out``
    defaulting to ``models/<out>``, ``--tokenizer`` (unless the trainer has its own) and
    ``--ckpt-dir``."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "models" / out)
    if tokenizer:
        ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    ap.add_argument("--ckpt-dir", type=Path, default=None,
                    help="default training/checkpoints/<out name>")
    return ap


def add_size_args(ap, mlp: str = "--intermediate") -> None:
    """The transformer sizes of ``train_ar``, ``train_asarm`` and ``train_llada`` (same
    defaults); ``mlp`` names the MLP width's option."""
    a = ap.add_argument
    a("--hidden", type=int, default=256)
    a("--layers", type=int, default=4)
    a("--heads", type=int, default=4)
    a(mlp, type=int, default=768)


def add_run_args(ap) -> None:
    """``--seed`` and ``--threads`` (of every training and evaluation script)."""
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)


def add_loop_args(ap, *, eval_every: int, eval_windows: int, lr: float = 2e-3) -> None:
    a = ap.add_argument
    a("--lr", type=float, default=lr)
    a("--min-lr-ratio", type=float, default=0.1)
    a("--warmup", type=int, default=100, help="warmup steps")
    a("--weight-decay", type=float, default=0.1)
    a("--grad-clip", type=float, default=1.0)
    a("--minutes", type=float, default=None, help="wall-clock budget (training + evals)")
    a("--max-steps", type=int, default=None)
    a("--eval-every", type=int, default=eval_every)
    a("--eval-windows", type=int, default=eval_windows,
      help="validation windows per periodic eval")
    a("--ckpt-every", type=float, default=3.0, help="minutes between checkpoints")
    add_run_args(ap)
    a("--no-bf16", action="store_true", help="train in fp32 instead of bf16 autocast")
    a("--resume", action="store_true")


def parse(ap, argv=None, *, no_budget_with: str | None = None) -> argparse.Namespace:
    """Parse; a budget (``--minutes`` and/or ``--max-steps``) is required unless the option
    ``no_budget_with`` (a run that does not train, e.g. ``eval_only``) is given."""
    args = ap.parse_args(argv)
    if args.minutes is None and args.max_steps is None and not (
            no_budget_with and getattr(args, no_budget_with)):
        ap.error("give --minutes and/or --max-steps")
    args.ckpt_dir = args.ckpt_dir or REPO_ROOT / "training" / "checkpoints" / args.out.name
    return args


def parse_model_trainer(ap, argv=None, *, eval_windows: int) -> argparse.Namespace:
    """The rest of a ``train_then_check`` trainer's command line (``--batch-size``,
    ``--eval-only``, the loop's options), parsed; the head size is checked."""
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--eval-only", type=Path, default=None,
                    help="only evaluate this saved model")
    add_loop_args(ap, eval_every=250, eval_windows=eval_windows)
    args = parse(ap, argv, no_budget_with="eval_only")
    if args.hidden % args.heads or args.hidden // args.heads < 32:
        ap.error("hidden/heads must divide into head_dim >= 32 (vLLM CPU attention)")
    return args


def rel(value):
    """JSON-friendly argument value; paths relative to the repository when inside it."""
    if isinstance(value, Path):
        value = value.resolve()
        return str(value.relative_to(REPO_ROOT)) if value.is_relative_to(REPO_ROOT) else str(value)
    return value


# ----------------------------------------------------------------------------- set-up
def setup(args) -> bool:
    """Threads and the global seed; returns whether to train under bf16 autocast."""
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(args.threads)
    torch.manual_seed(args.seed)
    return not args.no_bf16


def make_optimizer(model, args):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), fused=False)


def new_state(args, script: str, **fields) -> dict:
    """A fresh run's state: step, elapsed time and tokens seen at 0, then ``fields`` in their
    order, then the arguments and the command line (``python -m training.<script> ...``)."""
    return {"step": 0, "elapsed_s": 0.0, "tokens_seen": 0, **fields,
            "args": {k: rel(v) for k, v in vars(args).items()},
            "command": f"python -m training.{script} " + shlex.join(sys.argv[1:])}


def lr_at(args, step: int, progress: float) -> float:
    warm = min(1.0, (step + 1) / args.warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return args.lr * warm * (args.min_lr_ratio + (1 - args.min_lr_ratio) * cosine)


# ----------------------------------------------------------------------------- checkpoints
def save_checkpoint(path: Path, model, opt, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), **state}, tmp)
    os.replace(tmp, path)


def resume(ckpt_path, model, opt, state: dict, *, first_command: bool = False) -> bool:
    """Continue from ``ckpt_path`` if it exists (returns whether it did). The state keeps this
    run's arguments and command line, or with ``first_command`` the checkpoint's command
    line (that of the run that started the training)."""
    if not ckpt_path.exists():
        return False
    ckpt = torch.load(ckpt_path, weights_only=False)
    model.load_state_dict(ckpt.pop("model"))
    opt.load_state_dict(ckpt.pop("optim"))
    keep = ("args",) if first_command else ("args", "command")
    state.update({k: v for k, v in ckpt.items() if k not in keep})
    print(f"resumed from {ckpt_path} at step {state['step']} ({state['elapsed_s']:.0f}s)")
    return True


# ----------------------------------------------------------------------------- the loop
def train(args, model, opt, state: dict, ckpt_path, step_loss, periodic_eval, *,
          postfix=None, report: bool = True) -> bool:
    """Run until the budget is spent. ``step_loss(step) -> (loss tensor, {counter: int}[,
    {name: float}])``: the counters are summed into ``state``, the named floats kept there
    as exponential moving averages (like the loss, ``train_loss``). ``periodic_eval() ->
    dict`` is logged with the step every ``--eval-every`` steps (model in eval mode, no
    gradients). ``postfix(items) -> dict`` may change the progress bar's items (loss, lr,
    done). ``report``: print the closing line. Returns False when interrupted (checkpoint
    saved)."""
    budget_s = args.minutes * 60 if args.minutes else math.inf
    max_steps = args.max_steps or math.inf

    def progress() -> float:
        return max(state["step"] / max_steps, state["elapsed_s"] / budget_s)

    def moving(old, new: float) -> float:
        return new if old is None else 0.98 * old + 0.02 * new

    bar = tqdm(total=args.max_steps, initial=state["step"], mininterval=10, dynamic_ncols=True)
    t_last, t_ckpt, ema = time.time(), time.time(), state["train_loss"]
    model.train()
    try:
        while progress() < 1.0:
            step = state["step"]
            lr = lr_at(args, step, progress())
            for group in opt.param_groups:
                group["lr"] = lr
            loss, counters, *averages = step_loss(step)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            ema = moving(ema, loss.item())
            state.update(step=step + 1, train_loss=ema)
            for key, value in counters.items():
                state[key] = state.get(key, 0) + value
            for key, value in (averages[0] if averages else {}).items():
                state[key] = moving(state.get(key), value)
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
            items = {"loss": f"{ema:.3f}", "lr": f"{lr:.2e}", "done": f"{progress():.0%}"}
            bar.set_postfix(**(postfix(items) if postfix else items), refresh=False)
            if now - t_ckpt > args.ckpt_every * 60:
                save_checkpoint(ckpt_path, model, opt, state)
                t_ckpt = time.time()
    except KeyboardInterrupt:
        save_checkpoint(ckpt_path, model, opt, state)
        print(f"\ninterrupted; checkpoint at step {state['step']} -> {ckpt_path} (use --resume)")
        return False
    bar.close()
    save_checkpoint(ckpt_path, model, opt, state)
    if report:
        print(f"done: {state['step']} steps, {state['tokens_seen']} tokens, "
              f"{state['elapsed_s'] / 60:.1f} min; train loss (EMA) {ema:.4f}")
    return True


# ----------------------------------------------------------------------------- outputs
def copy_tokenizer(tokenizer_dir: Path, out: Path) -> None:
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, out / name)


def save_files(out: Path, tokenizer_dir: Path, *, bf16_config: dict | None = None) -> None:
    """After a model's ``save_pretrained``: ``model.safetensors`` readable by everyone (some
    writers create it 0600 via a temporary file), with ``bf16_config`` (``json.dumps``
    keywords) ``config.json`` rewritten with ``torch_dtype: "bfloat16"`` (transformers 5
    writes only ``dtype``, older readers look for ``torch_dtype``), and the tokenizer files."""
    os.chmod(out / "model.safetensors", 0o644)
    if bf16_config is not None:
        config_path = out / "config.json"
        config = json.loads(config_path.read_text())
        config["torch_dtype"] = "bfloat16"
        config_path.write_text(json.dumps(config, **bf16_config) + "\n")
    copy_tokenizer(tokenizer_dir, out)


# ----------------------------------------------------------------------------- a whole main
def train_then_check(args, script: str, build_model, val_data, step_loss, evaluate,
                     final_checks, *, counter: str, bf16_config: dict | None = None) -> dict:
    """Train ``build_model(args)`` (a model with ``save_pretrained``) on the train split, save
    it in bf16 to ``--out`` and run ``final_checks(path, args, val_data(validation stream,
    args), state, evaluate)`` on the saved copy; with ``--eval-only DIR`` only the checks, on
    DIR. ``val_data(stream, args, limit=None)``: validation batches (``limit`` windows for the
    periodic evaluation); ``step_loss(model, train stream, args, step, bf16) -> (loss,
    counters)``, ``counter`` the trainer's own counter besides ``tokens_seen``;
    ``evaluate(model, val_data, bf16) -> dict``. Returns the state."""
    bf16 = setup(args)
    val_stream = token_stream("validation", args.tokenizer)
    if args.eval_only is not None:
        state: dict = {}
        final_checks(args.eval_only, args, val_data(val_stream, args), state, evaluate)
        return state
    train_stream = token_stream("train", args.tokenizer)
    model = build_model(args)
    periodic = val_data(val_stream, args, limit=args.eval_windows)
    opt = make_optimizer(model, args)
    ckpt_path = args.ckpt_dir / "last.pt"
    state = new_state(args, script, **{counter: 0}, train_loss=None, evals=[],
                      train_tokens=len(train_stream), val_tokens=len(val_stream))
    if args.resume:
        resume(ckpt_path, model, opt, state)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model {n_params / 1e6:.2f}M params; train {len(train_stream)} tokens; "
          f"bf16 autocast={bf16}")
    if not train(args, model, opt, state, ckpt_path,
                 lambda step: step_loss(model, train_stream, args, step, bf16),
                 lambda: evaluate(model, periodic, bf16)):
        return state
    model.to(torch.bfloat16).eval().save_pretrained(args.out)
    save_files(args.out, args.tokenizer, bf16_config=bf16_config)
    final_checks(args.out, args, val_data(val_stream, args), state, evaluate)
    print(f"saved {args.out}")
    return state
