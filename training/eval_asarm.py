"""Final checks and model card of ``models/asarm`` (called by ``training.train_asarm``).

Owns what the card reports about the saved bf16 weights, reloaded in fp32:

* validation loss of the joint conditionals left to right and in random-subset orders, and of
  the draft queries (``train_asarm.evaluate``, passed in; every validation window);
* ``core.assd`` greedy continuation on benchmark prompts: model calls per generated token for
  sequential decoding (k = 1: one query-stream forward per token) and for self-drafting
  (Algorithm 1) and context-bigram drafting (Algorithm 2) at several k, and whether the
  outputs equal the sequential ones (they must: greedy ASSD is exact);
* one greedy continuation sample.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import torch

from training.data import benchmark_prompts, read_manifest
from training.model_card import _cpu_name, _dir_size, code_pair
from vllm_anyorder.core.assd import AssdSettings, generate
from vllm_anyorder.model_executor.asarm import load

MAX_NEW = 64
METHODS = ([("sequential", AssdSettings(k=1, temperature=0.0))]
           + [(f"assd self k={k}", AssdSettings(k=k, temperature=0.0)) for k in (2, 3, 4, 5)]
           + [(f"assd ngram k={k}", AssdSettings(k=k, temperature=0.0, drafter="ngram"))
              for k in (2, 3, 4, 5)])


def assd_eval(model, tok, n_prompts: int = 16) -> dict:
    prompts = [tok.encode(p) for p in benchmark_prompts(n_prompts, 48, tokenizer=tok)]
    rows, ref = [], None
    for name, s in METHODS:
        t0 = time.time()
        outs = [generate(model, p, MAX_NEW, s) for p in prompts]
        tokens = sum(len(o.tokens) for o in outs)
        calls = sum(o.model_calls for o in outs)
        ref = ref or [o.tokens for o in outs]
        acc = [r.accepted for o in outs for r in o.rounds if r.drafted > 1]
        rows.append({"method": name, "tokens": tokens, "forwards": calls,
                     "tokens_per_forward": round(tokens / calls, 3),
                     "mean_accepted": round(sum(acc) / len(acc), 2) if acc else None,
                     "same_as_sequential": sum(o.tokens == r for o, r in zip(outs, ref)) / len(ref),
                     "seconds": round(time.time() - t0, 1)})
        print(json.dumps(rows[-1]))
    return {"prompts": n_prompts, "prompt_tokens": 48, "max_new": MAX_NEW, "rows": rows}


def final_checks(path: Path, args, sets: dict, state: dict, evaluate) -> None:
    """``evaluate(model, sets, bf16) -> dict``: the trainer's validation loss."""
    from transformers import AutoTokenizer

    t0 = time.time()
    model = load(path, torch.float32)
    tok = AutoTokenizer.from_pretrained(str(args.tokenizer))
    state["final_val"] = evaluate(model, sets, bf16=False)
    print("validation (saved bf16 weights, fp32 compute):", json.dumps(state["final_val"]))
    state["assd"] = assd_eval(model, tok)
    prompt = benchmark_prompts(1, 48, tokenizer=tok)[0]
    out = generate(model, tok.encode(prompt), MAX_NEW, AssdSettings(k=1, temperature=0.0))
    state["sample"] = [prompt, tok.decode(list(out.tokens))]
    state["final_eval_s"] = round(time.time() - t0, 1)
    if "step" in state:
        (path / "training_log.json").write_text(json.dumps(state, indent=1) + "\n")
        write_card(path, model, state)


def write_card(out: Path, model, state: dict) -> None:
    c, a, m = model.config, state["args"], read_manifest()
    n_params = sum(p.numel() for p in model.parameters())
    fv, ev = state["final_val"], state["assd"]
    curve = "\n".join(f"| {e['step']} | {e['tokens']} | {e['elapsed_s'] / 60:.1f} | "
                      f"{e['train_loss']:.3f} | {e['val_l2r']:.3f} | {e['val_random']:.3f} | "
                      f"{e['val_l2r_draft']:.3f} |" for e in state["evals"])
    table = "\n".join(f"| {r['method']} | {r['tokens']} | {r['forwards']} | "
                      f"{r['tokens_per_forward']:.2f} | {r['mean_accepted'] or ''} | "
                      f"{r['same_as_sequential']:.0%} | {r['seconds']:.1f} |" for r in ev["rows"])
    prompt, text = state["sample"]
    (out / "MODEL_CARD.md").write_text(f"""# {out.name}

A {n_params / 1e6:.2f}M-parameter any-subset autoregressive model (AS-ARM) in the
`anyorder_llama` format (`AnySubsetLlamaForCausalLM`: Llama tensor names plus
`model.query_embed`; `vllm_anyorder.model_executor.asarm`), trained from scratch on the CPython
{m['python_version']} standard library for `method="assd"` tests, demos and benchmarks. It is
served by vLLM with the plugin (with or without `assd`); it writes Python-looking code.

## Model

Two streams sharing every weight: hidden {c.hidden_size}, {c.num_hidden_layers} layers,
{c.num_attention_heads} heads x head_dim {c.head_dim}, SwiGLU MLP {c.intermediate_size},
RMSNorm, rotary (theta {c.rope_theta:g}), tied embeddings / LM head. Parameters:
{n_params:,}. `model.safetensors` {(out / 'model.safetensors').stat().st_size / 1e6:.2f} MB
(bf16), directory {_dir_size(out) / 1e6:.2f} MB, tokenizer of `models/tokenizer` (vocab
{c.vocab_size}; EOS `<|endoftext|>` = 0, pad 1, no BOS prepended).

## Objective

The ASSD paper's teacher-forced joint loss (Sec. 6, Eq. 7) in one forward per window of
{a['length']} tokens: prompt attended bidirectionally, generated positions causally in
generation order, the query row of each generated position sees the tokens of lower rank;
cross-entropy averaged over generated positions. Rows:
{1 - a['subset_frac']:.0%} continuation (prompt = a prefix of U{{{a['min_prompt']}..{a['max_prompt']}}} tokens, identity order
after it), {a['subset_frac']:.0%} the paper's random-subset prompts (a uniform subset of
r N positions, r ~ U({a['min_subset']}, {a['max_subset']}), the rest generated left to right).
Beyond Eq. 7: every generated rank r also gets a draft query at the position of rank r + j,
j ~ U{{1..{a['draft_span'] - 1}}}, seeing only ranks < r, weight {a['draft_weight']} -- the
distributions self-drafting (Algorithm 1) samples, which Eq. 7 alone never trains (see
`training/train_asarm.py`).

## Training

AdamW (0.9/0.95, weight decay {a['weight_decay']}, clip {a['grad_clip']}), peak LR {a['lr']},
{a['warmup']} warmup steps, cosine to {a['min_lr_ratio']}x, bf16 autocast
{'off' if a['no_bf16'] else 'on'}, batch {a['batch_size']} random windows of the train split
({state['train_tokens']:,} tokens), seed {a['seed']}.

- steps: {state['step']}; window tokens seen {state['tokens_seen']:,}
  ({state['tokens_seen'] / state['train_tokens']:.2f} epochs); query rows with a loss
  {state['query_rows_seen']:,}
- final train loss (EMA, joint + weighted draft queries): {state['train_loss']:.4f}
- wall time: {state['elapsed_s'] / 60:.1f} min of training incl. periodic evals
  (+{state['final_eval_s']:.0f} s final checks), {a['threads']} thread on a shared 2-core
  {_cpu_name()} ({platform.machine()}), torch {torch.__version__}
- command: `{state['command']}`

| step | tokens | minutes | train loss | val left-to-right | val random orders | val draft queries (l2r) |
|---|---|---|---|---|---|---|
{curve}

(periodic: {a['eval_windows']} validation windows with fixed orders.)

## Validation (saved bf16 weights, fp32 compute, all validation windows)

Nats per generated token of the joint conditionals; draft queries: x at rank r + j given
ranks < r, j = 1..{a['draft_span'] - 1}.

| order | joint (Eq. 7) | draft queries |
|---|---|---|
| left to right after a 16-token prompt | {fv['val_l2r']:.4f} | {fv['val_l2r_draft']:.4f} |
| random-subset prompt (training's subset rows) | {fv['val_random']:.4f} | {fv['val_random_draft']:.4f} |

## ASSD in the engine-free core

`vllm_anyorder.core.assd.generate`, {ev['prompts']} benchmark prompts of <=
{ev['prompt_tokens']} tokens, {ev['max_new']} new tokens each, greedy (temperature 0;
no EOS stop). Sequential = k 1: one forward per token. A forward is one AS-ARM call; mean
accepted = drafts kept per round that drafted more than one position. Seconds on this CPU.

| method | tokens | forwards | tokens / forward | mean accepted | same as sequential | seconds |
|---|---|---|---|---|---|---|
{table}

## Greedy sample (sequential)

{code_pair(prompt, text)}""")
