"""Writes ``MODEL_CARD.md`` for a model saved by ``training.train_ar`` (``write_model_card``)
or ``training.train_mdlm`` (``write_drafter_card``).

Owns the card's content: data and split sizes (from ``training/splits.json``),
architecture, optimisation, tokens seen, losses, size on disk, the machine and
the wall time, plus one greedy sample from a benchmark prompt as a smoke test.
"""

from __future__ import annotations

import math
import platform
import shlex
import sys
from pathlib import Path

import torch

from benchmarks.common import cpu_model as _cpu_name
from training.data import read_manifest
from training.loop import rel


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def code_pair(prompt: str, text: str) -> str:
    """A card's closing sample: the prompt and the model's text as two Python code blocks."""
    return f"```python\n{prompt}```\n\n```python\n{text}\n```\n"


def greedy_sample(model, tok_dir: Path, max_new_tokens: int = 64) -> tuple[str, str]:
    """(prompt, greedy continuation) for the first benchmark prompt."""
    from transformers import AutoTokenizer

    from training.data import benchmark_prompts

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    prompt = benchmark_prompts(1, 48, tokenizer=tok)[0]
    ids = torch.tensor([tok.encode(prompt)])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tok.pad_token_id)
    return prompt, tok.decode(out[0, ids.shape[1]:])


def write_model_card(args, model, state: dict, *, intro: str | None = None,
                     training: str | None = None, extra: str = "") -> None:
    """``intro`` replaces the opening paragraph, ``training`` the body of the Training
    section (default: the from-scratch run of ``train_ar``), ``extra`` is markdown
    inserted before the greedy sample (used by ``train_jacobi``)."""
    out: Path = args.out
    cfg = model.config
    manifest = read_manifest()
    n_params = sum(p.numel() for p in model.parameters())
    weights = out / "model.safetensors"
    epochs = state["tokens_seen"] / state["train_tokens"]
    evals = state["evals"]
    prompt, sample = greedy_sample(model, out)
    split_rows = "\n".join(
        f"| {name} | {manifest['num_files'][name]} | {manifest['bytes'][name] / 1e6:.2f} MB |"
        for name in ("train", "validation", "benchmark"))
    curve = "\n".join(f"| {e['step']} | {e['tokens']} | {e['elapsed_s'] / 60:.1f} | "
                      f"{e['train_loss']:.3f} | {e['val_loss']:.3f} |" for e in evals)
    cmd = state.get("command") or "python -m training.train_ar " + shlex.join(sys.argv[1:])
    if intro is None:
        intro = (f"A {n_params / 1e6:.2f}M-parameter Llama-architecture causal LM trained from "
                 f"scratch on the\nCPython {manifest['python_version']} standard library, for the "
                 "vllm-anyorder tests,\ndemos and benchmarks. It writes Python-looking code; it is "
                 "not a useful assistant.")
    if training is None:
        training = f"""AdamW (betas 0.9/0.95, weight decay {args.weight_decay}, clip {args.grad_clip}), peak LR
{args.lr}, {args.warmup} warmup steps, cosine to {args.min_lr_ratio}x, bf16 autocast
{'off' if args.no_bf16 else 'on'}, batch {args.batch_size} x {args.seq_len} tokens of random
windows, seed {args.seed}."""
    text = f"""# {out.name}

{intro}

## Data

`.py` files of the interpreter's stdlib without `site-packages`, `test`/`tests`,
`idlelib`, `pydoc_data` and `_sysconfigdata*` (see `training/data.py`), split by
file on sha1(relative path) (manifest: `training/splits.json`).

| split | files | bytes |
|---|---|---|
{split_rows}

Tokenizer: byte-level BPE, vocab {cfg.vocab_size} (`models/tokenizer`, copied here);
`<|endoftext|>`=0 (BOS/EOS, separates files), `<|pad|>`=1, `<|mask|>`=2. No BOS is
prepended to prompts. Train split: {state['train_tokens']} tokens.

## Model

`LlamaForCausalLM`: hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers,
{cfg.num_attention_heads} heads x head_dim {cfg.head_dim}, {cfg.num_key_value_heads} KV heads,
MLP {cfg.intermediate_size}, tied embeddings, RoPE theta {args.rope_theta},
max positions {cfg.max_position_embeddings}. Parameters: {n_params:,}.
Stored as bf16 safetensors: `model.safetensors` {weights.stat().st_size / 1e6:.2f} MB,
whole directory {_dir_size(out) / 1e6:.2f} MB.

## Training

{training}

- steps: {state['step']}; tokens seen: {state['tokens_seen']:,} ({epochs:.2f} epochs)
- final train loss (EMA): {state['train_loss']:.4f}
- final validation loss (all {state['val_tokens']:,} validation tokens): {state['final_val_loss']:.4f}
  (perplexity {math.exp(state['final_val_loss']):.2f})
- wall time: {state['elapsed_s'] / 60:.1f} min of training incl. periodic evals
  (+{state.get('final_eval_s', 0):.0f} s final eval), {args.threads} thread on a
  {_cpu_name()} ({platform.machine()}), torch {torch.__version__}
- command: `{cmd}`

| step | tokens | minutes | train loss | val loss (subset) |
|---|---|---|---|---|
{curve}
{extra}
## Greedy sample

Prompt (first benchmark prompt, 48 tokens max), then 64 greedy tokens:

{code_pair(prompt, sample)}"""
    (out / "MODEL_CARD.md").write_text(text)


def drafter_sample(model, tok_dir: Path, gamma: int = 16, steps: int = 8) -> tuple[str, str]:
    """(prompt, greedy draft of ``gamma`` tokens in ``steps`` confidence-ordered unmasking
    steps) for the first benchmark prompt, via the engine's ``core.specdiff.draft``."""
    from transformers import AutoTokenizer

    from training.data import benchmark_prompts
    from vllm_anyorder.core.specdiff import SpecDiffSettings, draft

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    prompt = benchmark_prompts(1, 48, tokenizer=tok)[0]
    settings = SpecDiffSettings(num_draft_tokens=gamma, steps=steps,
                                context_window=model.spec.max_length - gamma)
    with torch.no_grad():
        out, _ = draft(model.token_logits, [tok.encode(prompt)], settings, model.spec.mask_token_id)
    return prompt, tok.decode(out[0])


def write_drafter_card(args, model, state: dict) -> None:
    """``MODEL_CARD.md`` for the masked-diffusion drafter saved by ``training.train_mdlm``."""
    out: Path = args.out
    spec = model.spec
    manifest = read_manifest()
    n_params = sum(p.numel() for p in model.parameters())
    weights = out / spec.weights_file
    epochs = state["tokens_seen"] / state["train_tokens"]
    prompt, sample = drafter_sample(model, args.tokenizer)  # not out: its config.json is MDLM's
    split_rows = "\n".join(
        f"| {name} | {manifest['num_files'][name]} | {manifest['bytes'][name] / 1e6:.2f} MB |"
        for name in ("train", "validation", "benchmark"))
    curve = "\n".join(f"| {e['step']} | {e['tokens']} | {e['elapsed_s'] / 60:.1f} | "
                      f"{e['train_loss']:.3f} | {e['val_loss']:.3f} | {e['val_suffix']:.3f} | "
                      f"{e['val_full']:.3f} |" for e in state["evals"])
    fv, dr = state["final_val"], state["drafting"]
    vs_target = (f"\n| AR target's greedy continuation (`models/ar-target`) | "
                 f"{dr['acc_vs_ar_target']:.3f} | {dr['prefix_vs_ar_target']:.2f} |"
                 if "acc_vs_ar_target" in dr else "")
    cmd = state.get("command") or "python -m training.train_mdlm " + shlex.join(sys.argv[1:])
    text = f"""# {out.name}

A {n_params / 1e6:.2f}M-parameter masked (absorbing-state) discrete-diffusion language model in
the released **MDLM format** (Sahoo et al. 2024; the layout of `kuleshov-group/mdlm-owt`),
trained from scratch on the CPython {manifest['python_version']} standard library as the
drafter of `method="specdiff"` for `models/ar-target`: given a clean context it fills gamma
masked positions in T denoising steps. It is a toy model for tests, demos and benchmarks.

## Format

`config.json` with `model_type: "mdlm"` (the keys of `mdlm-owt`, `time_conditioning: false`,
`torch_dtype: "{spec.torch_dtype}"`) and one `{spec.weights_file}` whose tensor names carry
the `backbone.` prefix (`backbone.rotary_emb.inv_freq` kept in fp32). Load it with
`vllm_anyorder.model_executor.masked_diffusion.load_drafter`. Vocabulary: {spec.vocab_size}
rows = the {spec.num_tokens} tokens of `models/tokenizer` (copied here) plus the **mask row
{spec.mask_token_id}** (= vocab_size - 1, as in MDLM); the tokenizer's own `<|mask|>` (id 2) is
an ordinary token to this model. No BOS is prepended; files are separated by `<|endoftext|>`=0.

## Model

DiT with adaLN conditioning: hidden {spec.hidden_size}, {spec.n_blocks} blocks,
{spec.n_heads} heads x head_dim {spec.hidden_size // spec.n_heads}, MLP {4 * spec.hidden_size}
(GELU tanh), cond_dim {spec.cond_dim}, bidirectional attention with rotary embeddings,
trained length {spec.max_length}. Parameters: {n_params:,}. `{spec.weights_file}`
{weights.stat().st_size / 1e6:.2f} MB (bf16), whole directory {_dir_size(out) / 1e6:.2f} MB.

## Objective

MDLM's masked cross-entropy with the SUBS parameterisation (the mask column is never
predicted, unmasked tokens carry over, so only masked positions have a loss), restricted to
the shape the drafter is used on:

- {1 - args.full_frac:.0%} of rows: a {spec.max_length}-token window whose last g ~ U{{{args.min_suffix}..{args.max_suffix}}}
  tokens form the suffix; each suffix token is masked with probability t ~ U(1e-3, 1), at least
  one; {args.short_frac:.0%} of these rows are first cut to a random shorter length (keys past
  it excluded), as when a generation has little context yet;
- {args.full_frac:.0%} of rows: MDLM masking of the whole window at a low rate
  t ~ U(1e-3, {args.full_max_rate}): within the short training budget the model is still
  learning to route neighbouring tokens through attention, and rows whose masks have visible
  neighbours teach that fastest (see `training/train_mdlm.py` for the ablation).

The loss is the mean over masked tokens. MDLM's ELBO weights each masked token by 1/t; that
weight is dropped: the drafter is used for its per-position denoising distribution, not as a
likelihood model, and 1/t puts most of the gradient on the rare low-t rows with one or two
masks, adding variance without helping drafting at the high mask rates decoding starts from
(a per-row mean, the ELBO weighting's effect in expectation, trained no faster in a
1000-step ablation). Since `time_conditioning` is false the network does not see t.

## Training

AdamW (betas 0.9/0.95, weight decay {args.weight_decay}, clip {args.grad_clip}), peak LR
{args.lr}, {args.warmup} warmup steps, cosine to {args.min_lr_ratio}x, bf16 autocast
{'off' if args.no_bf16 else 'on'}, batch {args.batch_size} windows of {spec.max_length} tokens
at random offsets of the train split ({state['train_tokens']:,} tokens), seed {args.seed};
adaLN modulations and the output projection start at zero (DiT/MDLM initialisation).

- steps: {state['step']}; tokens seen: {state['tokens_seen']:,} ({epochs:.2f} epochs), of which
  masked (with a loss): {state['masked_tokens_seen']:,}
- final train loss (EMA, nats per masked token): {state['train_loss']:.4f}
- wall time: {state['elapsed_s'] / 60:.1f} min of training incl. periodic evals
  (+{state.get('final_eval_s', 0):.0f} s final checks), {args.threads} thread on a
  {_cpu_name()} ({platform.machine()}), torch {torch.__version__}
- command: `{cmd}`

| step | tokens | minutes | train loss | val loss | val suffix rows | val full rows |
|---|---|---|---|---|---|---|
{curve}

(periodic validation: {args.eval_windows} fixed validation windows, fixed corruption; nats
per masked token.)

## Validation (the saved bf16 weights)

All {state['val_tokens']:,} validation tokens cut into {spec.max_length}-token windows, corrupted
once with the training mixture (fixed seed); nats per masked token:

| all masked tokens | suffix rows | full-window rows |
|---|---|---|
| {fv['all']:.4f} | {fv['suffix']:.4f} | {fv['full']:.4f} |

## Drafting check

Greedy drafts of {dr['gamma']} tokens after {dr['contexts']} validation contexts of
{dr['context_tokens']} tokens, {dr['steps']} confidence-ordered unmasking steps (one position
per step; the engine's `vllm_anyorder.core.specdiff.draft`):

| compared with | drafted positions correct | mean correct prefix (of {dr['gamma']}) |
|---|---|---|
| the true next tokens | {dr['acc_vs_text']:.3f} | {dr['prefix_vs_text']:.2f} |{vs_target}

## Greedy draft sample

First benchmark prompt (48 tokens max), then 16 drafted tokens in 8 steps:

{code_pair(prompt, sample)}"""
    (out / "MODEL_CARD.md").write_text(text)


def write_distilled_card(args, model, state: dict) -> None:
    """``MODEL_CARD.md`` for the drafter fine-tuned by ``training.distill_mdlm``."""
    out: Path = args.out
    n_params = sum(p.numel() for p in model.parameters())
    size = (out / model.spec.weights_file).stat().st_size / 1e6
    curve = "\n".join(f"| {e['step']} | {e['elapsed_s'] / 60:.1f} | {e['train_loss']:.3f} | "
                      f"{e['val_loss']:.3f} | {e['val_acc_first']:.3f} | {e['val_acc_all']:.3f} |"
                      for e in state["evals"])
    rows = "\n".join(f"| {name} | {d['acc_by_position']} | {d['mean_accepted_prefix']:.2f} |"
                     for name, d in (("before (`--init`)", state["init_drafting"]),
                                     ("after (this model)", state["drafting"])))
    prompt, sample = drafter_sample(model, args.tokenizer)
    text = f"""# {out.name}

The {n_params / 1e6:.2f}M-parameter MDLM-format drafter `{rel(args.init)}` fine-tuned so that its drafts
match the greedy continuations of the AR target `{rel(args.teacher)}` (distillation on the
target's own outputs): the drafter of `method="specdiff"` for that target. Same format, model
and vocabulary as the drafter it starts from (see its card); `{model.spec.weights_file}` {size:.2f} MB (bf16).
How it was made: `training/distill_mdlm.py` (its docstring states the objective). Drafts never
change what speculative decoding outputs, only how many tokens each target forward accepts.

## Data and training

{state['train_rows']:,} + {args.val_rows} held-out train-split contexts of {args.context_len} tokens at seeded
random offsets, each with the teacher's greedy continuation of {args.gamma} tokens (bf16
{'off' if args.no_bf16 else 'on'}). AdamW, peak LR {args.lr}, {args.warmup} warmup steps, cosine to
{args.min_lr_ratio}x, batch {args.batch_size}, seed {args.seed}; {state['step']} steps,
{state['masked_tokens_seen']:,} masked tokens with a loss, {state['elapsed_s'] / 60:.1f} min on
{args.threads} thread(s) of a {_cpu_name()} ({platform.machine()}), torch {torch.__version__}.
Command: `{state['command']}`

Held-out rows, 8 continuation tokens all masked, one forward (before: {state['init_val']}):

| step | minutes | train loss | val loss | first-position accuracy | all-position accuracy |
|---|---|---|---|---|---|
{curve}

## Drafting check (the saved bf16 model, held-out rows)

`core.specdiff.draft`, gamma 8, T 2, confidence schedule, against the teacher's continuation:

| drafter | accuracy by position | mean accepted prefix (of 8) |
|---|---|---|
{rows}

## Greedy draft sample

{code_pair(prompt, sample)}"""
    (out / "MODEL_CARD.md").write_text(text)

