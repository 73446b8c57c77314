"""Writes ``MODEL_CARD.md`` for a model saved by ``training.train_ar``.

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

from training.data import read_manifest


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


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


def write_model_card(args, model, state: dict) -> None:
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
    text = f"""# {out.name}

A {n_params / 1e6:.2f}M-parameter Llama-architecture causal LM trained from scratch on the
CPython {manifest['python_version']} standard library, for the vllm-anyorder tests,
demos and benchmarks. It writes Python-looking code; it is not a useful assistant.

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

AdamW (betas 0.9/0.95, weight decay {args.weight_decay}, clip {args.grad_clip}), peak LR
{args.lr}, {args.warmup} warmup steps, cosine to {args.min_lr_ratio}x, bf16 autocast
{'off' if args.no_bf16 else 'on'}, batch {args.batch_size} x {args.seq_len} tokens of random
windows, seed {args.seed}.

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

## Greedy sample

Prompt (first benchmark prompt, 48 tokens max), then 64 greedy tokens:

```python
{prompt}```

```python
{sample}
```
"""
    (out / "MODEL_CARD.md").write_text(text)
