"""Collects Jacobi trajectories of ``models/ar-target`` on train-split contexts.

Input of ``training.train_jacobi`` (progressive consistency distillation, pcLLM /
Jacobi Forcing Sec. 2.1 and 3.1).

Contexts: ``--contexts`` windows of the train split (the same token stream as
``training.train_ar``), each starting right after a newline token and free of
``<|endoftext|>``. Contexts are grouped in batches of ``--batch`` that share one
prompt length drawn uniformly from ``[--min-prompt, --max-prompt]``, so a batch
needs no padding. Everything is drawn from a generator seeded by (seed, batch).

Decoding: plain Jacobi iteration (paper Eq. 3), one fixed block of ``--block``
positions at a time, ``--blocks`` blocks per context (Eq. 4), fp32, batched over
the contexts, with the committed context in a KV cache. Block ``b`` starts from
``y(0)`` = tokens drawn uniformly from the context's prompt (the CLLM/pcLLM
random initial guess); one forward over ``[last committed token, y_1 .. y_{n-1}]``
gives ``y(j+1)`` (row ``i`` is the argmax for position ``i``); the block stops at
the first ``k`` with ``y(k) == y(k-1)`` and ``y(k)`` is committed (the KV cache is
extended by it). The trajectory of a block is ``[y(0), .., y(k)]`` (the fixed point
appears once, last); it has at most ``n + 1`` points.

Check: the concatenated fixed points must be the greedy AR continuation of the
prompt. One causal fp32 forward over ``prompt + fixed points`` (no cache) verifies
that every generated token is the argmax of its prefix; the number of contexts
where the cached Jacobi numerics and the full forward disagree on an argmax is
reported (such contexts are kept but flagged ``greedy_ok=False``;
``train_jacobi`` skips them).

Output: one ``torch.save`` file (default
``training/checkpoints/jacobi-trajectories/traj_n{block}.pt``), rewritten after
every batch, so an interrupted run continues where it stopped (the batches are
independent and seeded, so the result is the same).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from training.data import REPO_ROOT  # noqa: E402
from training.loop import add_run_args  # noqa: E402

EOS_ID = 0
FORMAT = 1


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a = ap.add_argument
    a("--model", type=Path, default=REPO_ROOT / "models" / "ar-target")
    a("--out", type=Path, default=None,
      help="default training/checkpoints/jacobi-trajectories/traj_n<block>.pt")
    a("--contexts", type=int, default=384)
    a("--batch", type=int, default=32, help="contexts decoded together (one prompt length)")
    a("--min-prompt", type=int, default=32)
    a("--max-prompt", type=int, default=64)
    a("--block", type=int, default=16, help="n: positions per Jacobi block")
    a("--blocks", type=int, default=8, help="blocks per context (new tokens = blocks * block)")
    add_run_args(ap)
    args = ap.parse_args(argv)
    if args.contexts % args.batch:
        ap.error("--contexts must be a multiple of --batch")
    args.out = args.out or (REPO_ROOT / "training" / "checkpoints" / "jacobi-trajectories"
                            / f"traj_n{args.block}.pt")
    return args


def config_of(args) -> dict:
    return {"format": FORMAT, "model": str(args.model.resolve()), "batch": args.batch,
            "min_prompt": args.min_prompt, "max_prompt": args.max_prompt, "block": args.block,
            "blocks": args.blocks, "seed": args.seed}


def line_start_table(tok_dir: Path) -> torch.Tensor:
    """[vocab] bool: the token's text contains a newline (the next token starts a line)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    return torch.tensor(["\n" in tok.decode([i], skip_special_tokens=False)
                         for i in range(tok.get_vocab_size())])


def sample_contexts(stream: torch.Tensor, newline: torch.Tensor, n: int, length: int,
                    g: torch.Generator) -> torch.Tensor:
    """``n`` windows of ``length`` tokens starting after a newline token, without EOS."""
    starts = torch.nonzero(newline[stream[:-length - 1].long()]).squeeze(1) + 1
    out = []
    while len(out) < n:
        s = int(starts[torch.randint(len(starts), (1,), generator=g)])
        window = stream[s:s + length].long()
        if not (window == EOS_ID).any():
            out.append(window)
    return torch.stack(out)


@torch.no_grad()
def jacobi_batch(model, prompts: torch.Tensor, n: int, blocks: int, g: torch.Generator):
    """Plain Jacobi decoding of ``blocks`` blocks of ``n`` for each row of ``prompts``.

    Returns (fixed [B, blocks*n], trajectories: list over rows of list over blocks of
    [k+1, n] int tensors, forwards per block [B, blocks]).
    """
    from transformers import DynamicCache

    B, P = prompts.shape
    cache = DynamicCache()
    model(input_ids=prompts[:, :-1], past_key_values=cache, use_cache=True)
    last = prompts[:, -1:]  # last committed token of every row
    ctx = P - 1  # tokens in the cache
    fixed = torch.empty(B, blocks * n, dtype=torch.long)
    trajs: list[list[torch.Tensor]] = [[] for _ in range(B)]
    iters = torch.zeros(B, blocks, dtype=torch.long)
    for b in range(blocks):
        # y(0): uniform draws from each row's prompt
        y = torch.gather(prompts, 1, torch.randint(P, (B, n), generator=g))
        hist = [[y[i].clone()] for i in range(B)]
        done = torch.zeros(B, dtype=torch.bool)
        for j in range(n + 1):
            logits = model(input_ids=torch.cat([last, y[:, :-1]], 1), past_key_values=cache,
                           use_cache=True).logits
            cache.crop(-n)  # drop the n rows just added
            nxt = logits.argmax(-1)
            same = (nxt == y).all(1)
            for i in torch.nonzero(~done).squeeze(1).tolist():
                iters[i, b] += 1
                if same[i]:
                    done[i] = True
                else:
                    hist[i].append(nxt[i].clone())
            y = torch.where(done[:, None], y, nxt)
            if done.all():
                break
        if not done.all():  # cannot happen: every iteration fixes at least one more token
            raise RuntimeError(f"block {b} did not converge in {n + 1} iterations")
        fixed[:, b * n:(b + 1) * n] = y
        for i in range(B):
            trajs[i].append(torch.stack(hist[i]))
        # commit the block: extend the cache by [last, y_1 .. y_{n-1}]
        model(input_ids=torch.cat([last, y[:, :-1]], 1), past_key_values=cache, use_cache=True)
        ctx += n
        last = y[:, -1:]
    return fixed, trajs, iters


@torch.no_grad()
def greedy_mismatch(model, prompts: torch.Tensor, fixed: torch.Tensor) -> torch.Tensor:
    """[B] first generated position whose token is not the argmax of its prefix (-1: none)."""
    seq = torch.cat([prompts, fixed], 1)
    P = prompts.shape[1]
    pred = model(input_ids=seq[:, :-1]).logits.argmax(-1)[:, P - 1:]
    bad = pred != fixed
    first = torch.where(bad.any(1), bad.float().argmax(1), torch.full_like(bad[:, 0], -1,
                                                                             dtype=torch.long))
    return first.long()


def load_existing(path: Path, config: dict) -> dict | None:
    if not path.exists():
        return None
    data = torch.load(path, weights_only=False)
    return data if data.get("config") == config else None


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(args.threads)
    from transformers import LlamaForCausalLM

    from training.windows import token_stream

    config = config_of(args)
    data = load_existing(args.out, config)
    if data is None:
        data = {"config": config, "samples": [], "elapsed_s": 0.0}
    else:
        print(f"continuing {args.out}: {len(data['samples'])} contexts done")
    n_batches = args.contexts // args.batch
    done_batches = len(data["samples"]) // args.batch
    data["samples"] = data["samples"][:done_batches * args.batch]
    if done_batches >= n_batches:
        print(f"{args.out} already holds {len(data['samples'])} contexts")
        return

    t0 = time.time()
    model = LlamaForCausalLM.from_pretrained(str(args.model), dtype=torch.float32).eval()
    stream = token_stream("train", args.model)
    newline = line_start_table(args.model)
    print(f"train stream {len(stream)} tokens; {args.contexts} contexts x {args.blocks} blocks "
          f"of {args.block}; threads={args.threads}; setup {time.time() - t0:.0f}s")
    bar = tqdm(total=n_batches, initial=done_batches, unit="batch", dynamic_ncols=True)
    for bi in range(done_batches, n_batches):
        tb = time.time()
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + bi)
        P = int(torch.randint(args.min_prompt, args.max_prompt + 1, (1,), generator=g))
        prompts = sample_contexts(stream, newline, args.batch, P, g)
        fixed, trajs, iters = jacobi_batch(model, prompts, args.block, args.blocks, g)
        first_bad = greedy_mismatch(model, prompts, fixed)
        for i in range(args.batch):
            data["samples"].append({
                "prompt": prompts[i].to(torch.int16),
                "fixed": fixed[i].to(torch.int16),
                "traj": [t.to(torch.int16) for t in trajs[i]],
                "iters": iters[i].to(torch.int16),
                "greedy_ok": bool(first_bad[i] < 0),
            })
        data["elapsed_s"] += time.time() - tb
        tmp = args.out.with_suffix(".tmp")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(data, tmp)
        os.replace(tmp, args.out)
        bar.update(1)
        tpf = (args.block * args.blocks) / iters.sum(1).float().mean().item()
        bar.set_postfix(P=P, tok_per_iter=f"{tpf:.3f}", bad=int((first_bad >= 0).sum()),
                        refresh=False)
    bar.close()
    s = data["samples"]
    ok = sum(x["greedy_ok"] for x in s)
    its = torch.stack([x["iters"] for x in s]).float()
    points = sum(len(t) for x in s for t in x["traj"])
    print(f"done: {len(s)} contexts ({ok} greedy-consistent), {points} trajectory points, "
          f"{its.mean().item():.2f} iterations per block of {args.block} "
          f"({args.block / its.mean().item():.3f} tokens per iteration incl. the confirming one), "
          f"{data['elapsed_s'] / 60:.1f} min -> {args.out}")


if __name__ == "__main__":
    main()
