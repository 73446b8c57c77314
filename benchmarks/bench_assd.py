"""Benchmark `assd` (self-drafting and context-bigram drafting) on the AS-ARM `models/asarm`
against the same AS-ARM served without speculation (its sequential greedy reference), for
continuation and for infilling (any-subset requests, `vllm_anyorder/infill.py`).

Reports per configuration: tokens per target forward (vLLM's counters: verification steps),
model forwards per token counting the self-drafting query-stream forwards, acceptance by
position, min/median wall clock over rounds (one engine alive at a time), speed-up vs no speculation, exact
match vs the no-speculation greedy output (for infilling: the filled tokens).

Infill requests are built from the same benchmark prompts: each prompt's tokens (the model's
tokenizer) with ``--masked`` positions hidden in two spans, one in the middle (right context
visible) and one at the end, filled left to right (the default generation order).

    .venv/bin/python benchmarks/bench_assd.py [--task continuation|infill|both] [--k 3 5]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import configs as C  # noqa: E402
from benchmarks.common import load_prompts  # noqa: E402
from benchmarks.compare import Config, compare  # noqa: E402


def masked_spans(length: int, masked: int) -> list[int]:
    """The masked positions of a ``length``-token sequence: ``masked // 2`` positions centred
    in the part before the trailing span, then the last ``masked - masked // 2`` positions."""
    middle, trailing = masked // 2, masked - masked // 2
    head = length - trailing  # tokens before the trailing span
    if head - middle < 2:
        raise ValueError(f"a {length}-token prompt is too short to mask {masked} positions")
    start = (head - middle) // 2
    return list(range(start, start + middle)) + list(range(head, length))


def infill_requests(texts: list[str], model: Path, masked: int, base_params):
    """(vLLM prompt dicts, one SamplingParams each) for the infill task, plus a description."""
    from transformers import AutoTokenizer

    from vllm_anyorder import infill

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    prompts, params, lengths = [], [], []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        hidden = set(masked_spans(len(ids), masked))
        request = infill.make_request([None if i in hidden else t for i, t in enumerate(ids)])
        prompts.append(request.prompt())
        params.append(infill.sampling_params(base_params, request))
        lengths.append(len(ids))
    describe = (f"infill: {len(texts)} sequences of {min(lengths)}-{max(lengths)} tokens, "
                f"{masked} masked each (middle span + trailing span), left to right")
    return prompts, params, describe


def print_forwards_per_token(rows: list[dict]) -> None:
    """Model forwards per generated token; the sequential rows spend one forward per token."""
    print("  model forwards per generated token (drafting forwards included):")
    for r in rows:
        forwards = r.get("model_forwards", r["generated"])
        print(f"    {r['method']:<24}{forwards / r['generated']:.3f} "
              f"({forwards} forwards / {r['generated']} tokens)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=["continuation", "infill", "both"], default="continuation")
    ap.add_argument("--model", type=Path, default=C.ASARM)
    ap.add_argument("--k", type=int, nargs="+", default=[3, 5])
    ap.add_argument("--drafters", nargs="+", default=["self", "ngram"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128, help="continuation: tokens generated")
    ap.add_argument("--masked", type=int, default=64,
                    help="infill: masked positions per sequence (prompts of 1.5-3x this length)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1, help="requests submitted together (0 = all)")
    args = ap.parse_args()

    from vllm import SamplingParams

    rows = [Config("no-spec (asarm)", model=args.model)]
    rows += [C.assd(k, d, args.model) for d in args.drafters for k in args.k]
    setting = f"(batch {args.batch or 'all'}), greedy"
    if args.task in ("continuation", "both"):
        prompts = load_prompts(args.prompts)
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
        result = compare("assd", args.model, rows, prompts, params, repeats=args.repeats,
                         batch=args.batch, describe=f"AS-ARM {args.model.name}; {len(prompts)} "
                                                    f"prompts x {args.max_tokens} tokens {setting}")
        print_forwards_per_token(result)
    if args.task in ("infill", "both"):
        texts = load_prompts(args.prompts, prompt_tokens=3 * args.masked)
        prompts, params, describe = infill_requests(texts, args.model, args.masked,
                                                    SamplingParams(temperature=0.0))
        result = compare("assd-infill", args.model, rows, prompts, params, repeats=args.repeats,
                         batch=args.batch,
                         describe=f"AS-ARM {args.model.name}; {describe} {setting}")
        print_forwards_per_token(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
