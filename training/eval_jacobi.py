"""Tokens per forward of Jacobi decoding, ar-target vs ar-target-jacobi (no vLLM).

What pcLLM / Jacobi Forcing measures (tokens per forward, TPF) on the benchmark prompts
(``training.data.benchmark_prompts``), greedy, with full-recompute fp32 forwards of the HF
model (one forward = one model call over the whole sequence; no KV cache, so counting is
exact and numerics are the same for every method). Methods:

* ``greedy``: AR decoding, one token per forward (TPF 1 by definition); the reference.
* ``jacobi``: plain Jacobi iteration (paper Eq. 3-4): fixed blocks of n positions, ``y(0)``
  = tokens drawn from the prompt (seeded per prompt, the same for every model), iterate
  until ``y(k) == y(k-1)``; all k forwards count, the confirming one included.
* ``core K=1`` / ``core K=2``: the project's engine-free Jacobi core
  (``vllm_anyorder.core.jacobi.JacobiState``) driven as in
  ``tests/reference/jacobi_reference.py``: a prefill forward, then one verification forward
  per step over ``[context, chain]``; the longest matching prefix plus the argmax at the
  first mismatch are committed. ``K=1, recycle off`` is Jacobi decoding with a KV-cache
  style commit; ``K=2, pool_first`` is the plugin's default (multi-block + recycling).

Every method's output is checked against the same model's greedy output (lossless). The
two models' greedy outputs are compared too: the distilled model is a different model.

    python -m training.eval_jacobi            # both models, 16 prompts, 128 tokens, n=16

Writes ``<--card>/jacobi_eval.json`` and the "Jacobi decoding" section of its
``MODEL_CARD.md`` (between ``<!-- eval_jacobi -->`` markers).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from training.data import REPO_ROOT, benchmark_prompts  # noqa: E402
from training.loop import add_run_args  # noqa: E402
from vllm_anyorder.core.jacobi import JacobiSettings, JacobiState  # noqa: E402

EOS_ID = 0
LOOP = 0.2  # a greedy output with >= 20% tokens equal to their predecessor counts as a loop
START, END = "<!-- eval_jacobi -->", "<!-- /eval_jacobi -->"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a = ap.add_argument
    a("--models", type=Path, nargs="+",
      default=[REPO_ROOT / "models" / "ar-target", REPO_ROOT / "models" / "ar-target-jacobi"])
    a("--card", type=Path, default=REPO_ROOT / "models" / "ar-target-jacobi",
      help="model directory whose card gets the figures ('' for none)")
    a("--prompts", type=int, default=16)
    a("--prompt-tokens", type=int, default=48)
    a("--new-tokens", type=int, default=128)
    a("--block", type=int, default=16)
    add_run_args(ap)
    a("--methods", nargs="+", default=None, help="subset of the Jacobi methods (default: all)")
    return ap.parse_args(argv)


class Counter:
    """Full-recompute argmax forward that counts its calls."""

    def __init__(self, model):
        self.model, self.calls = model, 0

    @torch.no_grad()
    def __call__(self, tokens: list[int]) -> list[int]:
        self.calls += 1
        return self.model(torch.tensor([tokens])).logits[0].argmax(-1).tolist()


def _cut(out: list[int], max_new: int) -> list[int]:
    out = out[:max_new]
    return out[:out.index(EOS_ID) + 1] if EOS_ID in out else out


def greedy(fwd, prompt: list[int], max_new: int) -> list[int]:
    out: list[int] = []
    while len(out) < max_new and (not out or out[-1] != EOS_ID):
        out.append(fwd(prompt + out)[-1])
    return out


def plain_jacobi(fwd, prompt: list[int], max_new: int, n: int, g: torch.Generator) -> list[int]:
    out: list[int] = []
    while len(out) < max_new and EOS_ID not in out:
        ctx = prompt + out
        y = [prompt[i] for i in torch.randint(len(prompt), (n,), generator=g).tolist()]
        while True:
            nxt = fwd(ctx + y[:-1])[len(ctx) - 1:]
            if nxt == y:
                break
            y = nxt
        out += y
    return _cut(out, max_new)


def core_jacobi(fwd, prompt: list[int], max_new: int, settings: JacobiSettings) -> list[int]:
    ctx = prompt + [fwd(prompt)[-1]]
    state = JacobiState(settings, ctx)
    while len(ctx) - len(prompt) < max_new and ctx[-1] != EOS_ID:
        chain = state.next_chain()
        rows = fwd(ctx + chain)[len(ctx) - 1:]
        m = 0
        while m < len(chain) and chain[m] == rows[m]:
            m += 1
        committed = chain[:m] + [rows[m]]
        state.advance(chain, rows, committed)
        ctx += committed
    return _cut(ctx[len(prompt):], max_new)


def methods(n: int) -> dict:
    return {
        "jacobi": None,
        "core K=1, recycle off": JacobiSettings(block_size=n, max_blocks=1, recycle="off"),
        "core K=2, recycle off": JacobiSettings(block_size=n, max_blocks=2, recycle="off"),
        "core K=2, pool_first": JacobiSettings(block_size=n, max_blocks=2),
    }


def evaluate_model(path: Path, prompts: list[list[int]], args) -> dict:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    fwd = Counter(model)
    res = {"greedy": [], "tokens": {}, "forwards": {}, "lossless": {}, "seconds": {},
           "per_prompt": {}}
    t0 = time.time()
    for p in tqdm(prompts, desc=f"{path.name} greedy", mininterval=10, leave=False):
        res["greedy"].append(greedy(fwd, p, args.new_tokens))
    res["seconds"]["greedy"] = round(time.time() - t0, 1)
    res["tokens"]["greedy"] = sum(map(len, res["greedy"]))
    res["forwards"]["greedy"] = fwd.calls
    res["lossless"]["greedy"] = True
    for name, settings in methods(args.block).items():
        if args.methods and name not in args.methods:
            continue
        fwd.calls, ok, total, t0 = 0, True, 0, time.time()
        per = res["per_prompt"][name] = []
        for i, p in enumerate(tqdm(prompts, desc=f"{path.name} {name}", mininterval=10,
                                   leave=False)):
            before = fwd.calls
            if settings is None:
                g = torch.Generator().manual_seed(args.seed * 1_000_003 + i)
                out = plain_jacobi(fwd, p, args.new_tokens, args.block, g)
            else:
                out = core_jacobi(fwd, p, args.new_tokens, settings)
            ok &= out == res["greedy"][i]
            total += len(out)
            per.append([len(out), fwd.calls - before])
        res["tokens"][name], res["forwards"][name] = total, fwd.calls
        res["lossless"][name] = bool(ok)
        res["seconds"][name] = round(time.time() - t0, 1)
    res["tpf"] = {k: res["tokens"][k] / res["forwards"][k] for k in res["forwards"]}
    res["distinct_4grams"] = distinct_ngrams(res["greedy"], 4)
    res["repeat_frac"] = [sum(a == b for a, b in zip(o[1:], o[:-1])) / max(1, len(o) - 1)
                          for o in res["greedy"]]
    # TPF restricted to prompts whose greedy output is not a token loop
    keep = [i for i, r in enumerate(res["repeat_frac"]) if r < LOOP]
    res["tpf_no_loops"] = {k: (sum(v[i][0] for i in keep) / max(1, sum(v[i][1] for i in keep)))
                           for k, v in res["per_prompt"].items()}
    res["no_loop_prompts"] = len(keep)
    log = path / "training_log.json"
    if log.exists():
        res["val_loss"] = json.loads(log.read_text()).get("final_val_loss")
    return res


def distinct_ngrams(outs: list[list[int]], k: int) -> float:
    """Distinct k-grams / k-grams of the greedy outputs, averaged over prompts (low values
    mean looping text, which n-gram recycling drafts well)."""
    vals = [len(set(zip(*(o[i:] for i in range(k))))) / max(1, len(o) - k + 1) for o in outs]
    return sum(vals) / len(vals)


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    prefix, same, total = [], 0, 0
    for x, y in zip(a, b):
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        prefix.append(k)
        same += sum(u == v for u, v in zip(x, y))
        total += max(len(x), len(y))
    return {"mean_common_prefix": sum(prefix) / len(prefix), "positional_agreement": same / total,
            "identical": sum(p == len(x) == len(y) for p, x, y in zip(prefix, a, b))}


def card_section(r: dict) -> str:
    names = list(r["models"])
    meths = list(r["models"][names[0]]["tpf"])
    head = "| method | " + " | ".join(f"{m}: TPF (forwards)" for m in names) + " |"
    rows = [head, "|---|" + "---|" * len(names)]
    for k in meths:
        cells = []
        for m in names:
            x = r["models"][m]
            flag = "" if x["lossless"][k] else " (NOT equal to greedy)"
            cells.append(f"{x['tpf'][k]:.3f} ({x['forwards'][k]}){flag}")
        rows.append(f"| {k} | " + " | ".join(cells) + " |")
    rep = ", ".join(f"{m}: {r['models'][m]['distinct_4grams']:.2f}" for m in names)
    loops = "; ".join(
        f"{m}: {r['prompts'] - x['no_loop_prompts']}/{r['prompts']} outputs are token loops "
        f"(mean immediate-repeat fraction {sum(x['repeat_frac']) / len(x['repeat_frac']):.2f}); "
        "TPF on the others: " + ", ".join(f"{k} {v:.3f}" for k, v in x["tpf_no_loops"].items())
        for m, x in ((m, r["models"][m]) for m in names) if "repeat_frac" in x)
    vl = ", ".join(f"{m}: {r['models'][m]['val_loss']:.4f}" for m in names
                    if r["models"][m].get("val_loss") is not None)
    ag = r.get("agreement")
    agree = (f"\nGreedy outputs of the two models: {ag['identical']}/{r['prompts']} identical, mean "
             f"common prefix {ag['mean_common_prefix']:.1f} tokens, positional agreement "
             f"{ag['positional_agreement']:.1%}.\n" if ag else "")
    return f"""{START}
## Jacobi decoding (`python -m training.eval_jacobi`)

{r['prompts']} benchmark prompts (`benchmark_prompts({r['prompts']}, {r['prompt_tokens']})`), up to
{r['new_tokens']} new tokens, greedy, block n = {r['block']}; TPF = tokens / model forwards
(full-recompute fp32 forwards; AR greedy = 1 by definition). `jacobi`: plain Jacobi iteration
(Eq. 3-4) from a random initial block (prompt tokens), confirming iteration counted; `core`:
the project's `vllm_anyorder.core.jacobi.JacobiState` with prefill + one verification forward
per step (K blocks in flight, n-gram recycling off or `pool_first`). Every Jacobi output equals
its own model's greedy output unless marked.

{chr(10).join(rows)}
{agree}
Distinct 4-grams / 4-grams of the greedy outputs (low = looping text, which the n-gram pools
of `pool_first` draft well): {rep}.

Degenerate loops (a greedy output where >= {LOOP:.0%} of the tokens repeat the token before
them, e.g. `name name name ...`; Jacobi converges on such text in a few iterations): {loops}.

Validation loss (nats/token, from each model's training_log.json): {vl}.
{END}
"""


def update_card(model_dir: Path, results: dict) -> None:
    card = model_dir / "MODEL_CARD.md"
    if not card.exists():
        return
    text = card.read_text()
    section = card_section(results)
    if START in text and END in text:
        a, b = text.index(START), text.index(END) + len(END) + 1
        text = text[:a] + section + text[b:]
    elif "## Greedy sample" in text:
        i = text.index("## Greedy sample")
        text = text[:i] + section + "\n" + text[i:]
    else:
        text = text + "\n" + section
    card.write_text(text)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(args.threads)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.models[0]))
    texts = benchmark_prompts(args.prompts, args.prompt_tokens, tokenizer=tok)
    prompts = [tok.encode(t, add_special_tokens=False) for t in texts]
    t0 = time.time()
    results = {"prompts": args.prompts, "prompt_tokens": args.prompt_tokens,
               "new_tokens": args.new_tokens, "block": args.block, "seed": args.seed,
               "models": {}}
    for path in args.models:
        r = evaluate_model(path, prompts, args)
        results["models"][path.name] = r
        print(f"{path.name}: " + ", ".join(f"{k} {v:.3f}" for k, v in r["tpf"].items())
              + f"; lossless {all(r['lossless'].values())}; val loss {r.get('val_loss')}")
    names = list(results["models"])
    if len(names) == 2:
        results["agreement"] = agreement(results["models"][names[0]]["greedy"],
                                         results["models"][names[1]]["greedy"])
        print("greedy agreement:", json.dumps(results["agreement"]))
    results["elapsed_s"] = round(time.time() - t0, 1)
    print(f"{results['elapsed_s'] / 60:.1f} min")
    if str(args.card) not in ("", "."):
        (args.card / "jacobi_eval.json").write_text(json.dumps(results, indent=1) + "\n")
        update_card(args.card, results)
        print(f"wrote {args.card / 'jacobi_eval.json'} and its MODEL_CARD.md section")


if __name__ == "__main__":
    main()
