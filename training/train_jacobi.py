"""Progressive consistency distillation of ``models/ar-target`` -> ``models/ar-target-jacobi``.

Paper: pcLLM / Jacobi Forcing, Sec. 3.1 and App. B. Input: the Jacobi trajectories of
the base model collected by ``training.jacobi_trajectories`` (prompt ``x``, fixed points
``y*_{B_1..B_N}`` = the greedy continuation, and every iterate of every block).

One training sequence per context (App. B, Fig. 1b):

    [x] [noisy_1][clean_1] [noisy_2][clean_2] ... [noisy_N][clean_N]

* clean_i = ``y*_{B_i}``; noisy_i = the point of block i's Jacobi trajectory whose number
  of tokens that differ from ``y*_{B_i}`` is closest to ``ceil(t_i * n)`` (ties: a seeded
  random choice). noisy_i and clean_i share RoPE positions.
* progressive noise schedule (Eq. 7): ``t_i = W[(i + phase) mod w]``, ``W = {0, 1/w, ..,
  (w-1)/w}``: the noise ratio rises linearly across the ``w`` blocks of a window, then
  restarts. ``--phase fixed`` is the paper's schedule (phase 0); ``--phase random`` (the
  default) draws the phase per sequence and step, a cyclic shift of the same schedule, so
  that with few trajectories every block is seen at every noise level over the epochs.
* noise-aware causal mask (Fig. 1b, the "noisy context" mask): a clean_i token sees ``x``,
  clean_1..clean_{i-1} and clean_i up to itself (plain causal attention over the clean
  text); a noisy_i token sees ``x``, the *noisy* blocks before it in its own window, the
  clean blocks of earlier windows, and noisy_i up to itself. It is passed to the HF Llama
  as a 4D boolean ``attention_mask`` with explicit ``position_ids``.
* progressive consistency loss (Eq. 8): at every offset of every noisy block,
  KL(p_theta-(. | clean context) || p_theta(. | noisy context)): the teacher is the same
  forward's logits at the same offset of clean_i, detached (theta- = stopgrad(theta));
  both predict the next position. L_pc is the mean over all N*n noisy positions, i.e.
  Eq. 8 (which sums over the n tokens of a block and averages over blocks) divided by n.
* AR loss (Eq. 9): next-token cross-entropy on *real* train text: the prompt of each
  packed sequence plus ``--ar-batch`` random windows of ``--seq-len`` train tokens per step.
  (The paper's L_AR is on the generated fixed points, which are the base model's own
  outputs; here the quality that matters is the validation NLL of real text, so the AR
  term is taken on real text. The clean blocks get no direct loss.)
* total: ``L = L_pc + --ar-weight * L_AR``.
* ``--teacher frozen`` (not the paper) takes the teacher from a frozen copy of the base
  model instead (an extra forward over ``x + y*``); kept as an option for comparison.

Not implemented: the second round on trajectories regenerated from the distilled model
with larger blocks ("Progressive Distillation for Larger Block Sizes"), EOS handling
(EOS is an ordinary token inside the 128 generated tokens here).

Everything else follows ``training.train_ar`` (``training.loop``): seeded (batches depend
only on (seed, step)), AdamW + warmup + cosine over ``--minutes``/``--max-steps``, one thread,
tqdm, validation AR loss (and held-out consistency metrics) every ``--eval-every``
steps, checkpoints in ``training/checkpoints/<out name>/last.pt`` every
``--ckpt-every`` minutes, on Ctrl-C and at the end (``--resume``). The result is saved
in ar-target's format (bf16 safetensors, config, generation_config, tokenizer files),
with ``training_log.json`` and ``MODEL_CARD.md``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from training import lora, loop  # noqa: E402
from training.data import REPO_ROOT  # noqa: E402
from training.loop import rel  # noqa: E402
from training.train_ar import evaluate, lm_loss, val_windows  # noqa: E402
from training.windows import random_windows, spread, step_generator, token_stream  # noqa: E402

PAD_ID = 1
PROMPT, NOISY, CLEAN, PAD = 0, 1, 2, 3


def parse_args(argv=None):
    ap = loop.parser(__doc__, "ar-target-jacobi", tokenizer=False)
    a = ap.add_argument
    a("--base", type=Path, default=REPO_ROOT / "models" / "ar-target")
    a("--traj", type=Path, default=REPO_ROOT / "training" / "checkpoints"
      / "jacobi-trajectories" / "traj_n16.pt")
    a("--window", type=int, default=8, help="w: blocks per noise-schedule window (Eq. 7)")
    a("--phase", choices=("random", "fixed"), default="random")
    a("--batch-size", type=int, default=8, help="packed trajectory sequences per step")
    a("--ar-batch", type=int, default=4, help="real-text windows per step for L_AR")
    a("--seq-len", type=int, default=256, help="length of the real-text windows")
    a("--ar-weight", type=float, default=6.0, help="w of Eq. 9")
    a("--fp-weight", type=float, default=3.0,
      help="weight of the paper's AR loss on the fixed points (clean blocks -> y*)")
    a("--teacher", choices=("self", "frozen"), default="self",
      help="self: the trained model's clean-context logits, detached (Eq. 8, theta- = "
           "stopgrad(theta)); frozen: the base model's (a fixed copy)")
    a("--val-contexts", type=int, default=32, help="trajectory contexts held out")
    a("--lora-rank", type=int, default=0,
      help="train low-rank adapters of this rank instead of every weight (0: full fine-tune); "
           "the adapter is saved to <out>-lora/ and the merged model to --out "
           "(training/lora.py)")
    a("--lora-alpha", type=float, default=None, help="LoRA alpha (default: 2 x rank)")
    loop.add_loop_args(ap, eval_every=100, eval_windows=48, lr=1e-3)
    a("--card-only", action="store_true",
      help="rewrite MODEL_CARD.md of --out from its training_log.json (no training)")
    args = loop.parse(ap, argv, no_budget_with="card_only")
    args.tokenizer = args.base
    args.lora_alpha = args.lora_alpha or 2.0 * args.lora_rank
    return args


def adapter_dir(args) -> Path:
    return args.out.with_name(args.out.name + "-lora")


# ----------------------------------------------------------------------------- data
def load_trajectories(path: Path, val_contexts: int):
    data = torch.load(path, weights_only=False)
    cfg = data["config"]
    samples = [s for s in data["samples"] if s["greedy_ok"]]
    prepared = []
    for s in samples:
        fixed = s["fixed"].long()
        n = cfg["block"]
        blocks = []
        for b, traj in enumerate(s["traj"]):
            traj = traj.long()
            noisy = (traj != fixed[b * n:(b + 1) * n]).sum(1)
            blocks.append((traj, noisy))
        prepared.append({"prompt": s["prompt"].long(), "fixed": fixed, "blocks": blocks})
    if len(prepared) <= val_contexts:
        raise ValueError(f"{path}: only {len(prepared)} usable contexts")
    info = {"contexts": len(data["samples"]), "usable": len(samples), "block": cfg["block"],
            "blocks": cfg["blocks"], "min_prompt": cfg["min_prompt"],
            "max_prompt": cfg["max_prompt"], "seed": cfg["seed"],
            "points": sum(len(t) for s in samples for t in s["traj"]),
            "iters_per_block": torch.stack([s["iters"] for s in samples]).float().mean().item(),
            "collect_s": data.get("elapsed_s")}
    return prepared[:-val_contexts], prepared[-val_contexts:], info


def pack(sample: dict, n: int, w: int, phase: int, g: torch.Generator | None):
    """Tokens, positions, segment kinds, block index, offset and window of one sequence."""
    prompt, fixed = sample["prompt"], sample["fixed"]
    P, N = len(prompt), len(sample["blocks"])
    toks, kinds, blk, off = [prompt], [torch.full((P,), PROMPT)], [torch.full((P,), -1)], \
        [torch.arange(P)]
    pos = [torch.arange(P)]
    levels = []
    for i, (traj, noisy) in enumerate(sample["blocks"]):
        level = (i + phase) % w
        target = math.ceil(level / w * n)
        dist = (noisy - target).abs()
        best = torch.nonzero(dist == dist.min()).squeeze(1)
        pick = best[torch.randint(len(best), (1,), generator=g)] if g is not None else best[0]
        levels.append(int(noisy[pick]))
        for kind, block in ((NOISY, traj[int(pick)]), (CLEAN, fixed[i * n:(i + 1) * n])):
            toks.append(block)
            kinds.append(torch.full((n,), kind))
            blk.append(torch.full((n,), i))
            off.append(torch.arange(n))
            pos.append(P + i * n + torch.arange(n))
    blk_t = torch.cat(blk)
    win = torch.where(blk_t >= 0, torch.div(blk_t + phase, w, rounding_mode="floor"), -1)
    return {"tokens": torch.cat(toks), "pos": torch.cat(pos), "kind": torch.cat(kinds),
            "fixed": fixed,
            "blk": blk_t, "off": torch.cat(off), "win": win, "P": P, "N": N, "levels": levels}


def noise_aware_mask(kind, blk, off, win) -> torch.Tensor:
    """[L, L] bool, True = query (row) may attend to key (column); see the module doc."""
    qk, kk = kind[:, None], kind[None, :]
    qb, kb = blk[:, None], blk[None, :]
    qo, ko = off[:, None], off[None, :]
    qw, kw = win[:, None], win[None, :]
    idx = torch.arange(len(kind))
    causal = idx[None, :] <= idx[:, None]
    same_block_causal = (qb == kb) & (ko <= qo)
    prompt_q = (qk == PROMPT) & (kk == PROMPT) & causal
    clean_q = (qk == CLEAN) & ((kk == PROMPT) | ((kk == CLEAN) & ((kb < qb) | same_block_causal)))
    noisy_q = (qk == NOISY) & (
        (kk == PROMPT)
        | ((kk == CLEAN) & (kb < qb) & (kw != qw))
        | ((kk == NOISY) & (((kb < qb) & (kw == qw)) | same_block_causal)))
    pad = (qk == PAD) & (idx[None, :] == idx[:, None])  # pads see themselves only (no NaN rows)
    return prompt_q | clean_q | noisy_q | pad


def collate(packs: list[dict]):
    L = max(len(p["tokens"]) for p in packs)
    B = len(packs)
    tokens = torch.full((B, L), PAD_ID)
    pos = torch.zeros(B, L, dtype=torch.long)
    mask = torch.zeros(B, 1, L, L, dtype=torch.bool)
    for b, p in enumerate(packs):
        m = len(p["tokens"])
        tokens[b, :m], pos[b, :m] = p["tokens"], p["pos"]
        fill = lambda t, v: torch.cat([t, torch.full((L - m,), v)])  # noqa: E731
        mask[b, 0] = noise_aware_mask(fill(p["kind"], PAD), fill(p["blk"], -2),
                                      fill(p["off"], 0), fill(p["win"], -2))
    return tokens, pos, mask


def gather_pairs(packs: list[dict], n: int):
    """Indices [B, N*n] of the noisy (student) and clean (teacher) rows, block-major."""
    stu, tea = [], []
    for p in packs:
        P, N = p["P"], p["N"]
        starts = P + 2 * n * torch.arange(N)
        stu.append((starts[:, None] + torch.arange(n)).flatten())
        tea.append((starts[:, None] + n + torch.arange(n)).flatten())
    return torch.stack(stu), torch.stack(tea)


def noisy_context(packs: list[dict], tokens: torch.Tensor, n: int) -> torch.Tensor:
    """[B, N*n] bool: the student row's visible context contains a token that differs from
    the clean text (elsewhere student and teacher see the same thing and the KL is 0)."""
    out = []
    for b, p in enumerate(packs):
        P, N = p["P"], p["N"]
        seq = tokens[b, P:P + 2 * N * n].view(N, 2, n)
        diff = seq[:, 0] != seq[:, 1]  # [N, n]
        within = diff.cumsum(1) > 0
        win = p["win"][P::2 * n][:N]
        earlier = torch.zeros(N, dtype=torch.bool)
        for i in range(1, N):
            same = (win[:i] == win[i])
            earlier[i] = bool((diff[:i].any(1) & same).any())
        out.append((within | earlier[:, None]).flatten())
    return torch.stack(out)


def make_batch(samples: list[dict], args, step: int, n: int):
    g = step_generator(args.seed, step)
    idx = torch.randint(len(samples), (args.batch_size,), generator=g).tolist()
    packs = []
    for i in idx:
        phase = int(torch.randint(args.window, (1,), generator=g)) if args.phase == "random" else 0
        packs.append(pack(samples[i], n, args.window, phase, g))
    return packs


def real_batch(stream: torch.Tensor, args, step: int) -> torch.Tensor:
    return random_windows(stream, args.seq_len + 1, args.ar_batch,
                          step_generator(args.seed, step, offset=7_777_777))


# ----------------------------------------------------------------------------- losses
@torch.no_grad()
def frozen_teacher(teacher, packs: list[dict], n: int, bf16: bool) -> torch.Tensor:
    """[B, N*n, V] log-probs of the frozen model on the clean text ``x + y*`` (causal)."""
    out = []
    for p in packs:
        seq = torch.cat([p["tokens"][:p["P"]], p["fixed"]])[None]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out.append(teacher(input_ids=seq).logits[0, p["P"]:].float().log_softmax(-1))
    return torch.stack(out)


def packed_losses(model, packs: list[dict], n: int, bf16: bool, teacher=None):
    """(L_pc, prompt CE sum, prompt CE count, metrics) of one packed batch; the teacher is
    the clean twin in the same forward (detached) unless a frozen ``teacher`` is given."""
    tokens, pos, mask = collate(packs)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=tokens, attention_mask=mask, position_ids=pos).logits
    logits = logits.float()
    stu, tea = gather_pairs(packs, n)
    ls = torch.gather(logits, 1, stu[..., None].expand(-1, -1, logits.shape[-1])).log_softmax(-1)
    if teacher is None:
        lt = torch.gather(logits, 1, tea[..., None].expand(-1, -1, logits.shape[-1])).detach() \
            .log_softmax(-1)
    else:
        lt = frozen_teacher(teacher, packs, n, bf16)
    kl = (lt.exp() * (lt - ls)).sum(-1)  # [B, N*n]
    l_pc = kl.mean()
    # AR term on the real prompt tokens
    ce_sum, ce_cnt = torch.zeros(()), 0
    for b, p in enumerate(packs):
        P = p["P"]
        ce_sum = ce_sum + F.cross_entropy(logits[b, :P - 1], tokens[b, 1:P], reduction="sum")
        ce_cnt += P - 1
    # the paper's AR term: the clean rows (and the prompt's last row) -> the fixed point y*
    rows = torch.cat([torch.tensor([[p["P"] - 1] for p in packs]), tea[:, :-1]], 1)
    fixed = torch.stack([p["fixed"] for p in packs])
    fp_ce = F.cross_entropy(torch.gather(logits, 1, rows[..., None].expand(
        -1, -1, logits.shape[-1])).flatten(0, 1), fixed.flatten())
    with torch.no_grad():
        noisy = noisy_context(packs, tokens, n)
        # fixed-point token each student row predicts (the next generated position)
        nxt = torch.stack([torch.cat([p["fixed"][1:], torch.tensor([-1])]) for p in packs])
        hit = (ls.argmax(-1) == nxt) & noisy & (nxt >= 0)
        valid = noisy & (nxt >= 0)
        metrics = {"kl_noisy_sum": float((kl * noisy).sum()), "noisy_rows": int(noisy.sum()),
                   "hit": int(hit.sum()), "valid": int(valid.sum()),
                   "teacher_hit": int(((lt.argmax(-1) == nxt) & valid).sum()),
                   "self_hit": int(((ls.argmax(-1) == lt.argmax(-1)) & noisy).sum())}
    metrics["fp_ce"] = fp_ce
    return l_pc, ce_sum, ce_cnt, metrics


@torch.no_grad()
def consistency_eval(model, samples: list[dict], args, n: int, bf16: bool) -> dict:
    """Held-out contexts, paper schedule (phase 0, first closest point): L_pc, KL on rows
    with a noisy context, and how often the student's argmax there is the fixed point."""
    model.eval()
    tot = {"l_pc": 0.0, "kl_noisy_sum": 0.0, "noisy_rows": 0, "hit": 0, "valid": 0,
           "teacher_hit": 0, "self_hit": 0}
    for i in range(0, len(samples), args.batch_size):
        packs = [pack(s, n, args.window, 0, None) for s in samples[i:i + args.batch_size]]
        l_pc, _, _, m = packed_losses(model, packs, n, bf16)
        tot["l_pc"] += l_pc.item() * len(packs)
        m.pop("fp_ce")
        for k in m:
            tot[k] += m[k]
    model.train()
    return {"val_l_pc": tot["l_pc"] / len(samples),
            "val_kl_noisy": tot["kl_noisy_sum"] / max(1, tot["noisy_rows"]),
            "val_noisy_acc": tot["hit"] / max(1, tot["valid"]),
            "val_teacher_acc": tot["teacher_hit"] / max(1, tot["valid"]),
            "val_self_acc": tot["self_hit"] / max(1, tot["noisy_rows"])}


# ----------------------------------------------------------------------------- save
def card_text(args, state: dict) -> tuple[str, str, str]:
    ti = state["trajectories"]
    intro = (f"`{rel(args.base)}` after **progressive consistency distillation** (pcLLM / Jacobi "
             f"Forcing, Sec. 3.1)\non its own Jacobi trajectories: the same Llama, fine-tuned so "
             f"that Jacobi decoding of blocks\nof {ti['block']} tokens converges in fewer "
             f"iterations. It is a different model from {args.base.name} (its greedy\noutput differs); "
             f"Jacobi decoding is lossless with respect to *this* model's greedy output.")
    base = state["base_val_loss"]
    teacher = ("the same forward's logits at the clean twin (stop-gradient, theta- of Eq. 8)"
               if args.teacher == "self" else "the frozen base model on the clean text")
    training = f"""Starts from `{rel(args.base)}` (validation loss {base:.4f} nats/token, same evaluation).

Trajectories (`training/jacobi_trajectories.py`): {ti['contexts']} train-split contexts of
{ti['min_prompt']}-{ti['max_prompt']} tokens (after a newline, no EOS), {ti['blocks']} blocks of n = {ti['block']}
(= {ti['blocks'] * ti['block']} greedy tokens) decoded by plain Jacobi iteration in fp32 from a random
initial guess (tokens of the prompt); {ti['usable']} contexts' fixed points verified equal to the
greedy continuation; {ti['points']:,} trajectory points, {ti['iters_per_block']:.2f} iterations per
block of {ti['block']} for the base model; {ti['collect_s'] / 60:.1f} min. The last {args.val_contexts} contexts are held out.

Objective (Eq. 9) `L = L_pc + {args.ar_weight} * L_AR`:
- one packed sequence per context `[x][noisy_1][clean_1]..[noisy_N][clean_N]`, noisy/clean
  pairs sharing positions; noisy_i = the trajectory point whose count of tokens differing
  from the fixed point is closest to ceil(t_i n), t_i = ((i + phase) mod {args.window}) / {args.window}
  (linear progressive schedule, window w = {args.window}; phase {args.phase}: {'a random cyclic shift per sequence and step' if args.phase == 'random' else '0, as in the paper'});
- noise-aware causal mask (Fig. 1b): noisy_i sees the prompt, the earlier *noisy* blocks of
  its window, the clean blocks of earlier windows and itself causally; clean blocks see the
  clean text causally (4D boolean attention mask on the HF Llama);
- L_pc: KL(teacher || student) at every noisy position, mean over positions (Eq. 8 / n);
  teacher = {teacher};
- L_AR: next-token cross-entropy on real train text (each packed prompt + {args.ar_batch} random
  windows of {args.seq_len} tokens per step), instead of the paper's AR loss on the generated
  fixed points, to keep the validation NLL of real text.

AdamW (betas 0.9/0.95, weight decay {args.weight_decay}, clip {args.grad_clip}), peak LR {args.lr},
{args.warmup} warmup steps, cosine to {args.min_lr_ratio}x, bf16 autocast {'off' if args.no_bf16 else 'on'},
batch {args.batch_size} packed sequences + {args.ar_batch} x {args.seq_len} real tokens, seed {args.seed}.
{lora_text(args, state)}Not implemented: the second round with trajectories of the distilled model and larger blocks.
"tokens seen" below counts the real-text tokens of L_AR (prompts included)."""
    def row(e: dict) -> str:
        train = "-" if math.isnan(e["l_pc"]) else f"{e['l_pc']:.3f}"
        self_acc = f"{e['val_self_acc']:.3f}" if "val_self_acc" in e else "-"
        return (f"| {e['step']} | {train} | {e['val_l_pc']:.3f} | {e['val_kl_noisy']:.3f} | "
                f"{self_acc} | {e['val_noisy_acc']:.3f} | {e['val_teacher_acc']:.3f} | "
                f"{'-' if math.isnan(e['val_loss']) else format(e['val_loss'], '.3f')} |")

    final = [{"step": f"{state['step']} (final, bf16)", "l_pc": state["l_pc"],
              "val_loss": math.nan, **state["final_consistency"]}] \
        if "final_consistency" in state else []
    rows = "\n".join(row(e) for e in [{"step": "0 (base)", "l_pc": math.nan,
                                        **state["base_eval"]}] + state["evals"] + final)
    fv = state["final_val_loss"]
    extra = f"""
"train loss" above is the EMA of `L_pc + {args.ar_weight} * L_AR`.

Consistency on the {args.val_contexts} held-out trajectory contexts (base-model trajectories, paper
schedule, phase 0): `val L_pc` = mean KL over all noisy positions; `KL noisy` = mean KL over
the positions whose context contains a wrong token; at those positions `self acc` = how often
the argmax under the noisy context equals the model's own argmax under the clean context
(what Jacobi decoding needs), `acc vs y*` = how often it equals the base model's fixed point;
`clean vs y*` = how often the model's clean-context argmax still equals the base model's
greedy token (its drift away from the base model's greedy output). Step 0 = the base model.

| step | train L_pc (EMA) | val L_pc | KL noisy | self acc | acc vs y* | clean vs y* | val AR loss (subset) |
|---|---|---|---|---|---|---|---|
{rows}

Validation loss, all {state['val_tokens']:,} validation tokens, saved bf16 weights, bf16 autocast:
**{fv:.4f}** nats/token (ppl {math.exp(fv):.2f}) vs **{base:.4f}** for `{args.base.name}`
({fv - base:+.4f}).
"""
    return intro, training, extra


def lora_text(args, state: dict) -> str:
    if not args.lora_rank:
        return ""
    return (f"Low-rank adapters (`training/lora.py`, rank {args.lora_rank}, alpha "
            f"{args.lora_alpha:g}) on every attention and MLP projection, the base frozen: "
            f"{state['lora_params']:,} trained parameters, stored in "
            f"`{rel(adapter_dir(args))}/` (bf16); `python -m training.lora build` merges them "
            f"into the base to give this model (the project commits one larger model).\n")


def write_card(model, args, state: dict) -> None:
    from training.model_card import write_model_card

    intro, training, extra = card_text(args, state)
    args.rope_theta = model.config.rope_parameters["rope_theta"]
    write_model_card(args, model, state, intro=intro, training=training, extra=extra)
    eval_json = args.out / "jacobi_eval.json"
    if eval_json.exists():  # keep the decoding figures of an eval_jacobi run
        from training.eval_jacobi import update_card
        update_card(args.out, json.loads(eval_json.read_text()))


def save_final(model, args, state: dict) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.bfloat16)
    model.config.use_cache = True  # turned off for training only
    model.save_pretrained(args.out, safe_serialization=True)
    loop.save_files(args.out, args.base, bf16_config={"indent": 2, "sort_keys": True})
    if not (args.out / "generation_config.json").exists():
        shutil.copy(args.base / "generation_config.json", args.out / "generation_config.json")
    (args.out / "training_log.json").write_text(json.dumps(state, indent=1) + "\n")
    write_card(model, args, state)


# ----------------------------------------------------------------------------- main
def main(argv=None) -> None:
    args = parse_args(argv)
    bf16 = loop.setup(args)
    from transformers import LlamaForCausalLM

    if args.card_only:
        state = json.loads((args.out / "training_log.json").read_text())
        write_card(LlamaForCausalLM.from_pretrained(str(args.out), dtype=torch.float32), args,
                   state)
        print(f"rewrote {args.out / 'MODEL_CARD.md'}")
        if args.lora_rank:
            copy_carried(args)
        return

    train_samples, val_samples, traj_info = load_trajectories(args.traj, args.val_contexts)
    n = traj_info["block"]
    stream = token_stream("train", args.tokenizer)
    val = val_windows(token_stream("validation", args.tokenizer), args.seq_len)
    periodic = spread(val, args.eval_windows)
    model = LlamaForCausalLM.from_pretrained(str(args.base), dtype=torch.float32)
    model.config.use_cache = False
    teacher = None
    if args.teacher == "frozen":
        teacher = LlamaForCausalLM.from_pretrained(str(args.base), dtype=torch.float32).eval()
        teacher.requires_grad_(False)
    lora_params = lora.attach(model, args.lora_rank, args.lora_alpha, args.seed) \
        if args.lora_rank else None
    opt = loop.make_optimizer(model, args)
    ckpt_path = args.ckpt_dir / "last.pt"
    state = loop.new_state(args, "train_jacobi", train_loss=None, l_pc=None, l_ar=None, evals=[],
                           train_tokens=len(stream), val_tokens=int(val[:, 1:].numel()),
                           trajectories=traj_info, lora_params=lora_params)
    if not (args.resume and loop.resume(ckpt_path, model, opt, state, first_command=True)):
        t0 = time.time()
        state["base_val_loss"] = evaluate(model, val, bf16)
        base_c = consistency_eval(model, val_samples, args, n, bf16)
        state["base_eval"] = {"val_loss": evaluate(model, periodic, bf16), **base_c}
        state["base_eval_s"] = round(time.time() - t0, 1)
        print(f"base: full validation loss {state['base_val_loss']:.4f}; "
              + json.dumps(state["base_eval"]))
    print(f"{len(train_samples)} train / {len(val_samples)} held-out trajectory contexts, "
          f"n={n}, window={args.window}, phase={args.phase}; bf16 autocast={bf16}; "
          f"threads={args.threads}")

    def step_loss(step):
        packs = make_batch(train_samples, args, step, n)
        l_pc, ce_sum, ce_cnt, met = packed_losses(model, packs, n, bf16, teacher)
        real = real_batch(stream, args, step) if args.ar_batch else None
        if real is not None:
            ce_sum = ce_sum + lm_loss(model, real, bf16, reduction="sum")
            ce_cnt += real[:, 1:].numel()
        l_ar = ce_sum / ce_cnt
        l_fp = met["fp_ce"]
        loss = l_pc + args.ar_weight * l_ar + args.fp_weight * l_fp
        return loss, {"tokens_seen": ce_cnt}, {
            "l_pc": l_pc.item(), "l_ar": l_ar.item(), "l_fp": l_fp.item()}

    def periodic_eval() -> dict:
        c = consistency_eval(model, val_samples, args, n, bf16)
        return {**{k: round(state[k], 4) for k in ("l_pc", "l_ar", "l_fp")},
                "val_loss": round(evaluate(model, periodic, bf16), 4),
                **{k: round(v, 4) for k, v in c.items()}}

    def losses_on_bar(items: dict) -> dict:
        return {**{k: f"{state[k]:.3f}" for k in ("l_pc", "l_ar", "l_fp")},
                "lr": items["lr"], "done": items["done"]}

    if not loop.train(args, model, opt, state, ckpt_path, step_loss, periodic_eval,
                      postfix=losses_on_bar, report=False):
        return
    t0 = time.time()
    if args.lora_rank:  # the adapter as stored, then the merged weights (lora.build's)
        lora.save_adapter(model, adapter_dir(args), {
            "base": rel(args.base), "built": rel(args.out), "rank": args.lora_rank,
            "alpha": args.lora_alpha})
        model = lora.merge(model)
    model = model.to(torch.bfloat16).float()  # evaluate the weights that get saved
    state["final_val_loss"] = evaluate(model, val, bf16)
    state["final_consistency"] = consistency_eval(model, val_samples, args, n, bf16)
    state["final_eval_s"] = round(time.time() - t0, 1)
    print(f"done: {state['step']} steps, {state['elapsed_s'] / 60:.1f} min; validation loss "
          f"{state['final_val_loss']:.4f} (base {state['base_val_loss']:.4f}); held-out "
          + json.dumps(state["final_consistency"]))
    save_final(model, args, state)
    print(f"saved {args.out}")
    if args.lora_rank:
        copy_carried(args)


def copy_carried(args) -> None:
    """The card and logs of a LoRA run go with its adapter (the merged model is built)."""
    for name in lora.CARRIED:
        if (args.out / name).exists():
            shutil.copy(args.out / name, adapter_dir(args) / name)
    (args.out / lora.STAMP).write_text(lora.adapter_sha1(adapter_dir(args)) + "\n")


if __name__ == "__main__":
    main()
