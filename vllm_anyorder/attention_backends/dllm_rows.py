"""The dLLM proposer's forwards over vLLM's paged cache, and the cache bookkeeping they need.

vLLM's own forward writes one unit per step (the prompt, then one decided block); when that
unit lands right after the clean prefix its K/V are final (block-causal attention,
``dllm_plans.py``). :class:`PagedPrefix` tracks, per request, how far the cache holds final K/V
(``clean``), how far vLLM has written slots (``written``) and, for logit-shift models
(Dream), the raw logits of the last clean row (``anchor``: row q predicts q + 1, so the first
row of a window needs the row before it). :class:`DllmRowRunner` runs the two kinds of
forward the proposer needs:

* ``repair``: rows [clean, c) that vLLM wrote incompletely (a preempted request recomputed as
  one prompt) are rewritten in place before they are read;
* ``evaluate``: ONE forward over every node (candidate canvas) of every job, each node's
  rows over the clean prefix (the implementation's ``node_plan``), returning per job logits
  ``[nodes, w1 - w0, V]`` aligned with the plan's window.

The proposer (``proposers/dllm.py``) only plans, advances and commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vllm_anyorder.attention_backends import dllm_plans
from vllm_anyorder.attention_backends.dllm_plans import NodeJob
from vllm_anyorder.core.dllm_blocks import block_span


@dataclass
class PagedPrefix:
    """Paged-cache state of one request (positions are absolute: prompt included)."""

    prompt_len: int
    clean: int = 0  # positions [0, clean) hold final K/V in the paged cache
    anchor: torch.Tensor | None = None  # raw logits of row clean - 1 (logit-shift models)
    written: int = 0  # end of the rows vLLM's last forward wrote (their slots exist)
    repairs: int = 0

    def observe_write(self, a: int, e: int, s: Any, last_row_logits, shift: int) -> None:
        """vLLM's forward wrote rows [a, e): final iff they are exactly the prompt or exactly
        one block right after the clean prefix (``s``: the request's DllmSettings)."""
        p = self.prompt_len
        self.written = e
        unit = (a == 0 and e == p) or (
            a >= p and (a - p) % s.block_length == 0 and a - p < s.max_tokens
            and e == p + block_span(s, (a - p) // s.block_length)[1])
        if self.clean == a and unit:
            self.clean = e
            self.anchor = last_row_logits.detach().float().cpu().clone() if shift else None
        else:
            self.clean = min(self.clean, a)


def group_cuts(prompt_len: int, s: Any, start: int, end: int) -> tuple[int, ...]:
    """Group ends for rows [start, end): the prompt end, then each block's end."""
    p = prompt_len
    cuts = [p] if start < p else []
    g = max(0, start - p)
    while p + g < end:
        g = block_span(s, g // s.block_length)[1]
        cuts.append(min(p + g, end))
    return tuple(c for c in cuts if c > start)


class DllmRowRunner:
    """Repair and evaluation forwards of ``model`` (a ``DllmForDiffusionLM``)."""

    def __init__(self, model: Any, shift: int) -> None:
        self.model, self.shift = model, shift

    def _context(self, view: Any):
        table = view.block_table
        device = next(self.model.parameters()).device
        return table.get_cpu_tensor(), int(table.block_size), view.metadata_builder(), device

    def repair(self, view: Any, jobs: list[tuple[PagedPrefix, Any, int, Any]]) -> None:
        """jobs: (prefix, request, batch row, plan). Rewrite, in the real cache, rows
        [clean, c) whose K/V vLLM wrote incompletely: c = the last unit boundary before both
        the plan's window and the end of vLLM's rows (their slots exist)."""
        todo = []
        for pre, req, i, plan in jobs:
            p, lim = pre.prompt_len, min(pre.prompt_len + plan.window[0], pre.written)
            c = p + (lim - p) // req.s.block_length * req.s.block_length if lim >= p else 0
            if pre.clean < c:
                todo.append((pre, req, i, c))
        if not todo:
            return
        blocks, bs, builder, device = self._context(view)
        node_jobs, ids, pos = [], [], []
        for pre, req, i, c in todo:
            node_jobs.append(NodeJob(blocks[i].to(torch.int64), pre.clean, c, 1,
                                     group_cuts(pre.prompt_len, req.s, pre.clean, c)))
            ids.append(torch.cat([req.prompt, req.canvas])[pre.clean:c])
            pos.append(torch.arange(pre.clean, c))
        plan = dllm_plans.repair_plan(builder, node_jobs, bs)
        out = self.model.row_logits(torch.cat(ids).to(device), torch.cat(pos).to(device), plan)
        end = 0
        for (pre, _, _, c), job in zip(todo, node_jobs):
            end += job.end - job.start
            pre.clean, pre.repairs = c, pre.repairs + 1
            pre.anchor = out[end - 1].float().cpu().clone() if self.shift else None

    def evaluate(self, view: Any, jobs: list[tuple[PagedPrefix, Any, int, Any]]
                 ) -> list[torch.Tensor]:
        """ONE forward over every node of every job -> per job logits [n, w1 - w0, V]."""
        blocks, bs, builder, device = self._context(view)
        node_jobs, ids, pos = [], [], []
        for pre, req, i, plan in jobs:
            # rows from the clean prefix on: normally the window itself; when the window
            # starts past a decided block vLLM has not written yet (FreeDave drafting across
            # a block end), that block's rows are computed alongside (block-causal: exact)
            p, (w0, w1) = pre.prompt_len, plan.window
            r0, n = min(pre.clean, p + w0), plan.nodes.shape[0]
            full = torch.cat([req.prompt.expand(n, -1), plan.nodes], 1)
            node_jobs.append(NodeJob(blocks[i].to(torch.int64), r0, p + w1, n,
                                     group_cuts(p, req.s, r0, p + w1)))
            ids.append(full[:, r0: p + w1].reshape(-1))
            pos.append(torch.arange(r0, p + w1).repeat(n))
        caches = [layer.self_attn.attn.kv_cache for layer in self.model.layers]
        plan_rows = builder.node_plan(node_jobs, caches, bs)  # the implementation's plan
        # in the model's dtype: the decisions read rows in float64 (exact from bf16 / fp32)
        raw = self.model.row_logits(torch.cat(ids).to(device), torch.cat(pos).to(device),
                                    plan_rows).cpu()
        out, start = [], 0
        for (pre, _, _, plan), job in zip(jobs, node_jobs):
            n, w = job.nodes, job.end - job.start
            lg = raw[start: start + n * w].view(n, w, -1)
            start += n * w
            skip = pre.prompt_len + plan.window[0] - job.start  # rows before the window
            if not self.shift:
                out.append(lg[:, skip:])
            elif skip:  # row q predicts q + 1: the row before the window was computed too
                out.append(lg[:, skip - 1: -1])
            else:  # ... or it is the last clean row: its logits are kept (the anchor)
                out.append(torch.cat([pre.anchor.expand(n, 1, -1), lg[:, :-1].float()], 1))
        return out
