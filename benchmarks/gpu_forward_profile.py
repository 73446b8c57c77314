"""Measure a ``gpu-measured`` cost profile: one forward of a Llama-8B-shaped and a LLaDA-8B-
shaped decoder (``target_shapes.py``) against the rows it evaluates, at batch 1-32, in plain
PyTorch (no vLLM, random weights, bf16). Run it where a GPU is lent:

    python benchmarks/gpu_forward_profile.py --out benchmarks/profiles/h100-measured.json
    python benchmarks/gpu_forward_profile.py --tiny --out /tmp/tiny.json   # CPU smoke test

What is timed, per (batch B, rows R, cached context C): B requests, each with C cached
positions in a contiguous K/V buffer and R / B new rows (AR: causal over the cache and its own
rows; dLLM: R / B = canvases x 32 rows, each canvas attending to the cache and bidirectionally
to itself, the ``ssd`` verification shape). A layer is RMSNorm, q/k/v/o projections, SDPA
with an explicit mask (GQA: the query heads of a KV head stacked as rows, so K/V are read once
and any masked SDPA kernel applies), the new K/V written into the buffer, and a SwiGLU MLP;
the output head (R x d @ d x vocab) is timed separately. Only ``--layers`` of the 32 layers
are built (4 by default, ~2 GB of weights instead of 16): the layers are
identical in shape, so the stack's time is scaled by 32 / layers and the head's added:
seconds = t_head + t_layers x 32 / layers. Left out: the embedding lookup and RoPE
(elementwise, small next to the matmuls), sampling and the engine's scheduler; the profile
carries a fixed per-step ``overhead_s`` for the last (an assumption, ``--overhead-ms``).
Each point is the median of ``--reps`` timed forwards after warm-up (CUDA events on a GPU);
on a GPU each forward replays a captured CUDA graph, as vLLM runs decode steps (``--eager``:
eager calls, which an 8B-shaped forward spends launching kernels).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.target_shapes import (LLADA_8B, LLAMA_8B, TINY_AR, TINY_DLLM,  # noqa: E402
                                      TargetShape)


class Stack:
    """``layers`` random decoder layers of ``shape`` + its output head, and K/V buffers."""

    def __init__(self, shape: TargetShape, layers: int, max_batch: int, max_len: int,
                 device: str, dtype: torch.dtype) -> None:
        self.s, self.device, self.dtype = shape, device, dtype
        d, hd, gen = shape.hidden, shape.head_dim, torch.Generator(device="cpu").manual_seed(0)

        def w(*size):
            return (torch.randn(*size, generator=gen) * 0.02).to(device, dtype)

        self.layers = [dict(q=w(shape.heads * hd, d), k=w(shape.kv_heads * hd, d),
                            v=w(shape.kv_heads * hd, d), o=w(d, shape.heads * hd),
                            gate=w(shape.ffn, d), up=w(shape.ffn, d), down=w(d, shape.ffn),
                            n1=torch.ones(d, device=device, dtype=dtype),
                            n2=torch.ones(d, device=device, dtype=dtype))
                       for _ in range(layers)]
        self.head = w(shape.vocab, d)
        kv = (max_batch, shape.kv_heads, max_len, hd)
        self.cache = [(torch.zeros(kv, device=device, dtype=dtype),
                       torch.zeros(kv, device=device, dtype=dtype)) for _ in range(layers)]

    def mask(self, q: int, context: int) -> torch.Tensor:
        """[groups x q, context + q] True where a new row may attend (rows of one KV head's
        query group stacked: see ``layers_forward``)."""
        rows = torch.arange(q, device=self.device)[:, None]
        keys = torch.arange(context + q, device=self.device)[None, :] - context
        if self.s.kind == "dllm":  # the cache, and its own canvas (bidirectional)
            same = (keys // self.s.block) == (rows // self.s.block)
            allowed = (keys < 0) | ((keys >= 0) & same)
        else:
            allowed = keys <= rows
        return allowed.repeat(self.s.heads // self.s.kv_heads, 1)

    def layers_forward(self, x: torch.Tensor, context: int, mask: torch.Tensor) -> torch.Tensor:
        """GQA without copying K/V: the query heads sharing a KV head are stacked as rows
        ([b, kv_heads, groups x q, hd]), so every SDPA kernel that takes a mask applies."""
        b, q, _ = x.shape
        s, hd, g = self.s, self.s.head_dim, self.s.heads // self.s.kv_heads
        for p, (kc, vc) in zip(self.layers, self.cache):
            h = F.rms_norm(x, (s.hidden,), p["n1"])
            qh = F.linear(h, p["q"]).view(b, q, s.kv_heads, g, hd).permute(0, 2, 3, 1, 4) \
                .reshape(b, s.kv_heads, g * q, hd)
            kc[:b, :, context:context + q] = F.linear(h, p["k"]).view(b, q, s.kv_heads,
                                                                      hd).transpose(1, 2)
            vc[:b, :, context:context + q] = F.linear(h, p["v"]).view(b, q, s.kv_heads,
                                                                      hd).transpose(1, 2)
            att = F.scaled_dot_product_attention(
                qh, kc[:b, :, :context + q], vc[:b, :, :context + q], attn_mask=mask)
            att = att.view(b, s.kv_heads, g, q, hd).permute(0, 3, 1, 2, 4)
            x = x + F.linear(att.reshape(b, q, s.heads * hd), p["o"])
            h = F.rms_norm(x, (s.hidden,), p["n2"])
            x = x + F.linear(F.silu(F.linear(h, p["gate"])) * F.linear(h, p["up"]), p["down"])
        return x

    def head_forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.head)


def timed(fn, reps: int, device: str, graph: bool = False) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls after two warm-up calls; with ``graph``
    (CUDA only) the calls replay one captured CUDA graph of ``fn``, as vLLM runs a decode
    step: without it an eager 8B-shaped forward is bound by kernel launches, not the GPU."""
    if graph and device.startswith("cuda"):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture stream, as PyTorch advises
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            fn()
        call = captured.replay
    else:
        call = fn
    for _ in range(2):
        call()
    times = []
    for _ in range(reps):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def grid(shape: TargetShape, batches: list[int], max_rows: int) -> list[tuple[int, int]]:
    """(batch, rows per request): AR rows ~ powers of two from B to ``max_rows``; dLLM 1, 2, 3,
    5, 9 canvases per request up to ``max_rows`` (at least one canvas each)."""
    out = []
    for b in batches:
        if shape.kind == "dllm":
            per = [n * shape.block for n in (1, 2, 3, 5, 9)]
            per = [q for q in per if b * q <= max_rows] or per[:1]
        else:
            per = sorted({max(1, r // b) for r in (2 ** i for i in range(12)) if r <= max_rows})
        out += [(b, q) for q in per]
    return out


def profile_shape(shape: TargetShape, args, device: str, dtype: torch.dtype) -> dict:
    layers = min(args.layers, shape.layers)
    max_rows = args.max_rows_dllm if shape.kind == "dllm" else args.max_rows
    points_bq = grid(shape, args.batches, max_rows)
    stack = Stack(shape, layers, max(args.batches), max(args.contexts)
                  + max(q for _, q in points_bq), device, dtype)
    points = []
    with torch.inference_mode():
        b, q = points_bq[-1]  # the largest shape first: allocator, kernels, thread pools
        timed(lambda: stack.layers_forward(torch.randn(b, q, shape.hidden, device=device,
                                                       dtype=dtype), 0, stack.mask(q, 0)),
              1, device)
        for context in args.contexts:
            for b, q in points_bq:
                x = torch.randn(b, q, shape.hidden, device=device, dtype=dtype)
                mask = stack.mask(q, context)
                t_layers = timed(lambda: stack.layers_forward(x, context, mask), args.reps,
                                 device, args.graphs)
                t_head = timed(lambda: stack.head_forward(x), args.reps, device, args.graphs)
                seconds = t_head + t_layers * shape.layers / layers
                points.append({"batch": b, "rows": b * q, "context": context,
                               "seconds": seconds, "layers_s": t_layers, "head_s": t_head})
                print(f"{shape.name} batch {b:>2} rows {b * q:>5} context {context:>5}: "
                      f"{seconds * 1e3:8.3f} ms", flush=True)
    del stack
    return {"shape": shape.as_dict(), "overhead_s": args.overhead_ms / 1e3,
            "layers_timed": layers, "points": points}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", help="profile name (default: the file's stem)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and grid (CPU test)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--layers", type=int, default=4, help="layers built and timed (scaled)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--max-rows", type=int, default=256)
    ap.add_argument("--max-rows-dllm", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--eager", dest="graphs", action="store_false",
                    help="time eager calls (default on CUDA: replay a captured CUDA graph)")
    ap.add_argument("--overhead-ms", type=float, default=2.0,
                    help="fixed per-step overhead added to every forward (assumed)")
    args = ap.parse_args(argv)
    shapes = [LLAMA_8B, LLADA_8B]
    if args.tiny:
        shapes = [TINY_AR, TINY_DLLM]
        args.batches, args.contexts, args.reps = [1, 2], [16], 3
        args.max_rows, args.max_rows_dllm = 8, 16
    dtype = getattr(torch, args.dtype)
    device_name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else \
        f"CPU ({args.device})"
    targets = {s.name: profile_shape(s, args, args.device, dtype) for s in shapes}
    timed_layers = {t["layers_timed"] for t in targets.values()}
    full = all(t["layers_timed"] == t["shape"]["layers"] for t in targets.values())
    depth = ("every layer timed (no scaling)" if full else
             f"{'/'.join(map(str, sorted(timed_layers)))} layers timed and scaled to the full "
             f"depth")
    graphs = args.graphs and args.device.startswith("cuda")
    label = (f"MEASURED on {device_name}: one plain-PyTorch forward"
             f"{' replayed as a CUDA graph' if graphs else ' (eager)'}, random {args.dtype} "
             f"weights, {depth}, output head timed; + {args.overhead_ms:g} ms per-step "
             f"overhead (assumed, not measured)")
    out = Path(args.out)
    profile = {"name": args.name or out.stem, "kind": "gpu-measured", "label": label,
               "notes": f"benchmarks/gpu_forward_profile.py; torch {torch.__version__}",
               "targets": targets}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile, indent=1) + "\n")
    print(f"wrote {out} ({label})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
