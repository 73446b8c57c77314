"""True positions of an AS-ARM's rows for infill requests (``vllm_anyorder.infill``).

vLLM numbers a request's tokens by sequence index (its ``positions``). For a continuation
that is the true position; for an infill request the sequence is [visible tokens, masked
positions in generation order], so sequence index i sits at ``table[i]`` (the request's
:func:`vllm_anyorder.infill.position_table`). The AS-ARM needs:

* content row at sequence index i: rotary at ``table[i]`` (the cache write itself stays at the
  sequence index's slot: slots follow the engine's order, only the rotary phase changes);
* query row after sequence index i: it predicts the *next token vLLM will append*, i.e.
  position ``table[i + 1]`` (a continuation's ``i + 1``).

Indices past the table (vLLM's placeholder rows after a 1-token prompt, the bonus row of
the last token) read position P + M: their outputs are never used, but must be a valid
rotary position. The tables reach the attention metadata builder through
:data:`POSITION_TABLES` (set by patch ``asarm_infill_positions`` around the runner's
metadata building, in input-batch row order; None when no infill request is in the batch).
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any

import torch

POSITION_TABLES: contextvars.ContextVar[list[torch.Tensor | None] | None] = \
    contextvars.ContextVar("anyorder_asarm_position_tables", default=None)

_CACHE_ATTR = "_anyorder_position_table"
logger = logging.getLogger("vllm_anyorder")


def request_table(state: Any) -> torch.Tensor | None:
    """[P + M + 1] long: sequence index -> true position (last entry P + M, for indices past
    the end) of a runner request state, or None for a continuation. Cached on the state."""
    cached = getattr(state, _CACHE_ATTR, False)
    if cached is not False:
        return cached
    from vllm_anyorder import infill

    sp = getattr(state, "sampling_params", None)
    table = None
    try:  # checked by the front end (patch infill_requests); a request that bypassed it
        masked = infill.parse(getattr(sp, "extra_args", None))  # must not crash the engine
        if masked is not None:
            num_prompt = int(getattr(state, "num_prompt_tokens", None)
                             or len(state.prompt_token_ids))
            infill.check(masked, num_prompt)
            full = infill.position_table(num_prompt, masked)
            table = torch.tensor(full + [len(full)], dtype=torch.int64)
    except infill.InfillError as exc:
        logger.error("vllm_anyorder: request %s: malformed infill entry ignored (served as a "
                     "continuation): %s", getattr(state, "req_id", "?"), exc)
    try:
        setattr(state, _CACHE_ATTR, table)
    except AttributeError:  # a state object without __dict__: recompute next time
        pass
    return table


def lookup(table: torch.Tensor | None, seq_index: torch.Tensor) -> torch.Tensor:
    """True positions of sequence indices [R] (identity for a continuation)."""
    if table is None:
        return seq_index
    return table[seq_index.clamp(max=table.numel() - 1)]


def batch_tables(runner: Any) -> list[torch.Tensor | None] | None:
    """Per input-batch row, the request's table; None when no row is an infill request."""
    batch = getattr(runner, "input_batch", None)
    requests = getattr(runner, "requests", None)
    if batch is None or requests is None:
        return None
    tables = [request_table(requests[r]) if r in requests else None for r in batch.req_ids]
    return tables if any(t is not None for t in tables) else None


def row_positions(cm: Any, tables: list[torch.Tensor | None], query_rows: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(content positions [num_actual_tokens], query positions [len(query_rows)]) of a
    vLLM forward whose rows are laid out request by request as in ``cm``."""
    num_reqs = cm.num_reqs
    qsl = cm.query_start_loc_cpu[: num_reqs + 1].to(torch.int64).tolist()
    seq_lens = cm.seq_lens[:num_reqs].cpu().to(torch.int64).tolist()
    content, following = [], []
    for i in range(num_reqs):
        idx = torch.arange(seq_lens[i] - (qsl[i + 1] - qsl[i]), seq_lens[i])
        table = tables[i] if i < len(tables) else None
        content.append(lookup(table, idx))
        following.append(lookup(table, idx + 1))
    device = cm.seq_lens.device
    empty = torch.zeros(0, dtype=torch.int64)
    content_pos = torch.cat(content) if content else empty
    next_pos = torch.cat(following) if following else empty
    return content_pos.to(device), next_pos[query_rows.cpu()].to(device)
