"""Final checks and model card of ``models/llada-dllm`` (called by ``training.train_llada``).

Owns what the card reports about the saved bf16 weights, reloaded in fp32:

* validation loss per row kind (``train_llada.evaluate``, passed in; every validation
  window);
* one greedy block-decoding sample (``vllm_anyorder.core.dllm.generate``, ``stepwise``);
* tokens per forward of ``stepwise`` / ``ssd`` (N drafted steps) / ``freedave`` (d drafted
  steps) in the engine-free core on benchmark prompts, with the fraction of outputs equal to
  ``stepwise`` (the methods' guarantee: identical up to floating-point near-ties).
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import torch

from training.data import benchmark_prompts, read_manifest
from training.model_card import _cpu_name, _dir_size, code_pair
from vllm_anyorder.core.dllm import generate
from vllm_anyorder.core.dllm_blocks import DllmSettings
from vllm_anyorder.model_executor.llada import LLaDAModel

DECODE = dict(max_tokens=64, block_length=32, steps_per_block=32)  # one token per step
METHODS = ([("stepwise", {})] + [(f"ssd N={n}", {"method": "ssd", "draft_length": n})
                                 for n in (3, 4, 5)]
           + [(f"freedave d={d}", {"method": "freedave", "draft_steps": d}) for d in (2, 4, 8)])


def _tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def decode_eval(model, tok, n_prompts: int = 16) -> dict:
    prompts = [tok.encode(p) for p in benchmark_prompts(n_prompts, 48, tokenizer=tok)]
    base = dict(mask_id=model.mask_token_id, eos_id=model.eos_token_id, **DECODE)
    rows, ref = [], None
    for name, kw in METHODS:
        t0 = time.time()
        outs = generate(model, prompts, DllmSettings(**base, **kw))
        seconds = time.time() - t0
        tokens = sum(len(o.tokens) for o in outs)
        forwards = sum(o.forwards for o in outs)
        ref = ref or [o.tokens for o in outs]
        rows.append({"method": name, "tokens": tokens, "forwards": forwards,
                     "tokens_per_forward": round(tokens / forwards, 3),
                     "nodes_per_forward": round(sum(o.nodes for o in outs) / forwards, 2),
                     "same_as_stepwise": sum(o.tokens == r for o, r in zip(outs, ref)) / len(ref),
                     "seconds": round(seconds, 1)})
        print(json.dumps(rows[-1]))
    return {"prompts": n_prompts, "prompt_tokens": 48, **DECODE, "rows": rows}


def sample(model, tok) -> tuple[str, str]:
    prompt = benchmark_prompts(1, 48, tokenizer=tok)[0]
    s = DllmSettings(mask_id=model.mask_token_id, eos_id=model.eos_token_id, **DECODE)
    return prompt, tok.decode(generate(model, [tok.encode(prompt)], s)[0].tokens)


def final_checks(path: Path, args, val, state: dict, evaluate) -> None:
    """``evaluate(model, val, bf16) -> dict``: the trainer's validation loss."""
    t0 = time.time()
    model = LLaDAModel.from_pretrained(path, dtype=torch.float32)
    tok = _tokenizer(args.tokenizer)  # not path: its config.json names remote code
    state["final_val"] = evaluate(model, val, bf16=False)
    print("validation (saved bf16 weights, fp32 compute):", json.dumps(state["final_val"]))
    state["decode"] = decode_eval(model, tok)
    state["sample"] = sample(model, tok)
    state["final_eval_s"] = round(time.time() - t0, 1)
    if "step" in state:  # a training run; ``--eval-only`` prints and leaves DIR's files alone
        (path / "training_log.json").write_text(json.dumps(state, indent=1) + "\n")
        write_card(path, args, model, state)


def write_card(out: Path, args, model, state: dict) -> None:
    c = model.config
    n_params = sum(p.numel() for p in model.parameters())
    m = read_manifest()
    fv, dec = state["final_val"], state["decode"]
    curve = "\n".join(f"| {e['step']} | {e['tokens']} | {e['elapsed_s'] / 60:.1f} | "
                      f"{e['train_loss']:.3f} | {e['val_full_ce']:.3f} | {e['val_cont_ce']:.3f} |"
                      for e in state["evals"])
    table = "\n".join(f"| {r['method']} | {r['tokens']} | {r['forwards']} | "
                      f"{r['tokens_per_forward']:.2f} | {r['nodes_per_forward']:.2f} | "
                      f"{r['same_as_stepwise']:.0%} | {r['seconds']:.1f} |" for r in dec["rows"])
    prompt, text = state["sample"]
    a = state["args"]
    (out / "MODEL_CARD.md").write_text(f"""# {out.name}

A {n_params / 1e6:.2f}M-parameter masked-diffusion LLM in the released **LLaDA format**
(`model_type "llada"`, `LLaDAModelLM`, `model.transformer.` tensor names; read and written by
`vllm_anyorder.model_executor.llada`), trained from scratch on the CPython
{m['python_version']} standard library for the `ssd` / `freedave` tests, demos and
benchmarks. It writes Python-looking code; it is a toy.

## Format

`config.json` (LLaDA's 46 keys; `weight_tying: true`, `torch_dtype: "bfloat16"`),
`model.safetensors` in bf16 ({(out / 'model.safetensors').stat().st_size / 1e6:.2f} MB;
directory {_dir_size(out) / 1e6:.2f} MB), the tokenizer of `models/tokenizer` (vocab 4096).
**`mask_token_id` = 2**, the tokenizer's `<|mask|>` (LLaDA-8B's 126336 is that release's own
id; the code reads the id from config.json), `eos_token_id` = 0 (`<|endoftext|>`, also the
file separator in training), `pad_token_id` = 1. No BOS is prepended.

## Model

Bidirectional Llama-shaped encoder: d_model {c.d_model}, {c.n_layers} layers, {c.n_heads}
heads x head_dim {c.head_dim}, SwiGLU MLP {c.hidden}, RMSNorm, rotary (theta {c.rope_theta:g}),
tied embeddings / LM head, no logit shift (row i predicts position i). Parameters:
{n_params:,}.

## Objective

LLaDA's: t ~ U(0, 1] (p = 0.999 u + 0.001), each token of the noised part masked with
probability p, cross-entropy on masked tokens weighted 1/p, normalised by the noised part's
length. {a['full_frac']:.0%} of rows are pre-training rows (a {a['length']}-token window, all
of it noised, full bidirectional attention); the rest are SFT-style continuation rows: a
clean prefix of U{{{a['min_prefix']}..{a['length'] - 16}}} tokens is never masked, the
continuation is cut into blocks of {' or '.join(map(str, a['blocks']))} tokens, each masked
at its own rate, under the block-causal attention of block decoding with the committed
prefix cached (`core.dllm_cache`, `prefix` policy). One forward gives every block's loss: the
row holds the clean window plus a noised copy of the continuation at the same positions;
noised block b attends to the prefix, the clean blocks before it and itself (see
`training/train_llada.py`).

## Training

AdamW (0.9/0.95, weight decay {a['weight_decay']}, clip {a['grad_clip']}), peak LR {a['lr']},
{a['warmup']} warmup steps, cosine to {a['min_lr_ratio']}x, bf16 autocast
{'off' if a['no_bf16'] else 'on'}, batch {a['batch_size']} windows of {a['length']} tokens
at random offsets of the train split ({state['train_tokens']:,} tokens), seed {a['seed']}.

- steps: {state['step']}; window tokens seen {state['tokens_seen']:,}
  ({state['tokens_seen'] / state['train_tokens']:.2f} epochs), masked tokens with a loss
  {state['masked_tokens_seen']:,}
- final train loss (EMA, weighted objective): {state['train_loss']:.4f}
- wall time: {state['elapsed_s'] / 60:.1f} min of training incl. periodic evals
  (+{state['final_eval_s']:.0f} s final checks), {a['threads']} thread on a shared 2-core
  {_cpu_name()} ({platform.machine()}), torch {torch.__version__}
- command: `{state['command']}`

| step | tokens | minutes | train loss | val CE, full rows | val CE, continuation rows |
|---|---|---|---|---|---|
{curve}

(periodic: {a['eval_windows']} validation windows, fixed corruption; nats per masked token.)

## Validation (saved bf16 weights, fp32 compute, all validation windows)

| rows | nats per masked token | 1/t-weighted bound (nats per token) |
|---|---|---|
| pre-training (full, bidirectional) | {fv['val_full_ce']:.4f} | {fv['val_full_bound']:.4f} |
| continuation (clean prefix, block-causal) | {fv['val_cont_ce']:.4f} | {fv['val_cont_bound']:.4f} |

## Block decoding in the engine-free core

`vllm_anyorder.core.dllm.generate` (cache policy `prefix`), {dec['prompts']} benchmark
prompts of <= {dec['prompt_tokens']} tokens, {dec['max_tokens']} generated positions, block
length {dec['block_length']}, {dec['steps_per_block']} steps per block (one token per step),
greedy, low-confidence remasking, EOS 0 ends an output. A forward is one batched model call
for a request (all its nodes); seconds are for the 16 prompts in lock-step on this CPU.

| method | tokens | forwards | tokens / forward | nodes / forward | same as stepwise | seconds |
|---|---|---|---|---|---|---|
{table}

## Greedy block-decoding sample

First benchmark prompt, then the `stepwise` output above (block length 32):

{code_pair(prompt, text)}""")
