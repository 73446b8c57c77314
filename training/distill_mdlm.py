"""Distils an MDLM-format drafter from an AR target: the masked suffix learns the target's greedy continuation.

Owns ``models/mdlm-drafter-distilled/``: the drafter of ``models/mdlm-drafter`` (same DiT,
same released MDLM layout, 4097-row vocabulary) fine-tuned so that its drafts are what
``method="specdiff"`` verifies against: the target's greedy tokens, not the text's. The SpecDiff
paper (Christopher et al. 2024) pairs a diffusion drafter and an AR target trained on the same
data; at this project's sizes that is not enough (the from-scratch drafter's first draft
matches `models/ar-target-large`'s greedy token about half the time, RESULTS.md), so this is
the standard remedy for weak drafters, distillation on the target's own outputs (as for AR
drafters in DistillSpec, Zhou et al. 2024). Drafts never change what speculative decoding
outputs; only how many are accepted.

Two stages, both resumable (``--resume``):

1. **Teacher data** (``<ckpt-dir>/teacher_data.pt``): ``--contexts`` windows of
   ``--context-len`` tokens at seeded random offsets of the train split, each followed by the
   teacher's greedy continuation of ``--gamma`` tokens (transformers ``generate``, bf16 unless
   ``--no-bf16``; EOS is not allowed inside the continuation). Saved once a minute.
2. **Fine-tuning** (``training.loop``): each row is context + continuation; a suffix of g ~
   U{``--min-suffix``..gamma} continuation tokens is kept (later keys excluded), each of them
   masked with probability t ~ U(1e-3, 1) (at least one), so the model sees every partly
   revealed state T-step drafting passes through; with probability ``--short-frac`` the first
   s ~ U{0..context_len - 16} context tokens are excluded as keys (short contexts; rotary
   attention is relative, so this equals a shorter window). Loss: cross-entropy over the real
   tokens at masked positions (MDLM's SUBS parameterisation, as ``training.train_mdlm``).

The last ``--val-rows`` rows are held out: periodic evaluation (all g = 8 suffix tokens
masked: loss, first-position and all-position accuracy of one-shot argmax) and the final
drafting check (``core.specdiff.draft``, gamma 8, T 2, confidence schedule, against the
teacher's continuation) on the saved bf16 model.

    python -m training.distill_mdlm --minutes 25 --threads 2
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from training import loop  # noqa: E402
from training.data import REPO_ROOT  # noqa: E402
from training.train_mdlm import masked_ce  # noqa: E402
from training.windows import random_windows, step_generator, token_stream  # noqa: E402
from vllm_anyorder.model_executor.masked_diffusion import load_drafter, save_drafter  # noqa: E402

MODELS = REPO_ROOT / "models"


def parse_args(argv=None):
    ap = loop.parser(__doc__, "mdlm-drafter-distilled")
    a = ap.add_argument
    a("--teacher", type=Path, default=MODELS / "ar-target-large")
    a("--init", type=Path, default=MODELS / "mdlm-drafter", help="drafter to start from")
    a("--contexts", type=int, default=20000)
    a("--context-len", type=int, default=112)
    a("--gamma", type=int, default=16, help="teacher tokens per context")
    a("--teacher-batch", type=int, default=64)
    a("--min-suffix", type=int, default=4)
    a("--short-frac", type=float, default=0.3)
    a("--batch-size", type=int, default=16)
    a("--val-rows", type=int, default=512)
    loop.add_loop_args(ap, eval_every=500, eval_windows=512, lr=1e-3)
    args = loop.parse(ap, argv)
    if not 1 <= args.min_suffix <= args.gamma or args.context_len < 32:
        ap.error("need 1 <= --min-suffix <= --gamma and --context-len >= 32")
    if args.contexts <= args.val_rows:
        ap.error("--contexts must exceed --val-rows")
    return args


# ---------------------------------------------------------------------------- stage 1
@torch.inference_mode()
def teacher_data(args, stream: torch.Tensor) -> torch.Tensor:
    """[contexts, context_len + gamma] long: train windows + the teacher's greedy tokens."""
    from transformers import AutoModelForCausalLM

    path = args.ckpt_dir / "teacher_data.pt"
    meta = {k: loop.rel(getattr(args, k)) for k in ("teacher", "contexts", "context_len", "gamma", "seed")}
    done = torch.load(path) if path.exists() else None
    rows = done["rows"] if done is not None and done["meta"] == meta else []
    contexts = random_windows(stream, args.context_len, args.contexts,
                              torch.Generator().manual_seed(args.seed + 7))
    if len(rows) >= args.contexts:
        return torch.cat(rows)[: args.contexts].long()
    dtype = torch.float32 if args.no_bf16 else torch.bfloat16
    teacher = AutoModelForCausalLM.from_pretrained(str(args.teacher), dtype=dtype).eval()
    made = sum(len(r) for r in rows)
    bar = tqdm(total=args.contexts, initial=made, desc="teacher continuations", mininterval=10)
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    saved_at = time.time()
    while made < args.contexts:
        ctx = contexts[made : made + args.teacher_batch]
        out = teacher.generate(ctx, max_new_tokens=args.gamma, min_new_tokens=args.gamma,
                               do_sample=False, pad_token_id=1)
        rows.append(out.to(torch.int16))
        made += len(ctx)
        bar.update(len(ctx))
        if made >= args.contexts or time.time() - saved_at > 60:  # resumable, cheaply
            torch.save({"meta": meta, "rows": rows}, path)
            saved_at = time.time()
    bar.close()
    return torch.cat(rows).long()


# ---------------------------------------------------------------------------- stage 2
def corrupt(x: torch.Tensor, gen: torch.Generator, args, mask_id: int, suffix=None, rate=None):
    """(noisy, masked, key_mask) for rows ``x`` [B, context_len + gamma] (module docstring);
    ``suffix``/``rate`` fix g and t (evaluation), otherwise they are drawn from ``gen``."""
    b, width = x.shape
    c = args.context_len
    col = torch.arange(width)[None, :]
    g = torch.randint(args.min_suffix, args.gamma + 1, (b,), generator=gen) if suffix is None \
        else torch.full((b,), suffix)
    t = 1e-3 + (1 - 1e-3) * torch.rand(b, generator=gen) if rate is None else torch.full((b,), rate)
    short = torch.rand(b, generator=gen) < args.short_frac
    skip = torch.where(short, torch.randint(0, c - 15, (b,), generator=gen), torch.zeros_like(g))
    zone = (col >= c) & (col < c + g[:, None])
    masked = zone & (torch.rand(b, width, generator=gen) < t[:, None])
    forced = c + (torch.rand(b, generator=gen) * g).long()
    masked[torch.arange(b), forced] = True
    key_mask = (col >= skip[:, None]) & (col < c + g[:, None])
    return x.masked_fill(masked, mask_id), masked, key_mask


@torch.no_grad()
def evaluate(model, rows: torch.Tensor, args, bf16: bool) -> dict:
    """All 8 first continuation tokens masked, full context: loss and one-shot accuracy."""
    mask_id = model.spec.mask_token_id
    noisy, masked, key_mask = corrupt(rows, torch.Generator().manual_seed(1234), args, mask_id,
                                      suffix=8, rate=1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(noisy, torch.zeros(len(rows)), key_mask, positions=masked)
    logits = logits[:, : model.spec.num_tokens].float()
    labels = rows[masked]
    correct = (logits.argmax(-1) == labels).view(len(rows), 8)
    loss = torch.nn.functional.cross_entropy(logits, labels).item()
    return {"val_loss": round(loss, 4), "val_acc_first": round(correct[:, 0].float().mean().item(), 4),
            "val_acc_all": round(correct.float().mean().item(), 4)}


@torch.no_grad()
def drafting_check(model, rows: torch.Tensor, args, gamma: int = 8, steps: int = 2) -> dict:
    """The engine's drafting (``core.specdiff.draft``) against the teacher's continuation."""
    from vllm_anyorder.core.specdiff import SpecDiffSettings, draft

    settings = SpecDiffSettings(num_draft_tokens=gamma, steps=steps, context_window=args.context_len)
    drafts = []
    for i in range(0, len(rows), 32):
        out, _ = draft(model.token_logits, rows[i:i + 32, : args.context_len].tolist(), settings,
                       model.spec.mask_token_id)
        drafts.append(torch.tensor(out))
    eq = torch.cat(drafts) == rows[:, args.context_len : args.context_len + gamma]
    return {"contexts": len(rows), "gamma": gamma, "steps": steps, "schedule": "confidence",
            "acc_by_position": [round(v, 4) for v in eq.float().mean(0).tolist()],
            "mean_accepted_prefix": round(eq.long().cumprod(1).sum(1).float().mean().item(), 3)}


def main(argv=None) -> None:
    args = parse_args(argv)
    bf16 = loop.setup(args)
    data = teacher_data(args, token_stream("train", args.tokenizer))
    train_rows, val_rows = data[: -args.val_rows], data[-args.val_rows:]
    model = load_drafter(args.init, dtype="float32")
    mask_id = model.spec.mask_token_id
    opt = loop.make_optimizer(model, args)
    ckpt_path = args.ckpt_dir / "last.pt"
    state = loop.new_state(args, "distill_mdlm", masked_tokens_seen=0, train_loss=None, evals=[],
                           train_rows=len(train_rows), init_val=evaluate(model, val_rows, args, bf16))
    if args.resume:
        loop.resume(ckpt_path, model, opt, state)
    print(f"teacher data {tuple(data.shape)}; start {json.dumps(state['init_val'])}")

    def step_loss(step):
        gen = step_generator(args.seed, step)
        x = train_rows[torch.randint(0, len(train_rows), (args.batch_size,), generator=gen)]
        noisy, masked, key_mask = corrupt(x, gen, args, mask_id)
        loss = masked_ce(model, x, noisy, masked, key_mask, bf16)
        return loss, {"tokens_seen": int(key_mask.sum()), "masked_tokens_seen": int(masked.sum())}

    if not loop.train(args, model, opt, state, ckpt_path, step_loss,
                      lambda: evaluate(model, val_rows, args, bf16)):
        return
    save_drafter(model.to(torch.bfloat16).eval(), args.out)
    loop.copy_tokenizer(args.tokenizer, args.out)
    t0 = time.time()
    saved = load_drafter(args.out)
    state["final_val"] = evaluate(saved, val_rows, args, bf16=False)
    state["drafting"] = drafting_check(saved, val_rows, args)
    state["init_drafting"] = drafting_check(load_drafter(args.init), val_rows, args)
    state["final_eval_s"] = round(time.time() - t0, 1)
    (args.out / "training_log.json").write_text(json.dumps(state, indent=1) + "\n")
    from training.model_card import write_distilled_card

    write_distilled_card(args, saved, state)
    print("final:", json.dumps(state["final_val"]), json.dumps(state["drafting"]))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
