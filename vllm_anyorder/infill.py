"""Any-subset infilling requests for an AS-ARM served by vLLM (``assd`` or plain decoding).

vLLM's engine appends tokens to a sequence; an AS-ARM does not care in which order positions
are filled, because its rotary positions are the tokens' *true* positions and its content
stream is causal in generation order (Guo & Ermon, Sec. 3-4). So an infill request rides on
the append-only engine unchanged:

* the **prompt** is the visible tokens, in positional order (attended bidirectionally);
* the **generated tokens** are the masked positions, in a generation order the request names:
  ``SamplingParams.extra_args = {"anyorder_infill": [p_1, ..., p_M]}`` (on the OpenAI server
  the body's ``vllm_xargs``); output token j is the token at position ``p_{j+1}``;
* the sequence is P + M long (P visible, M masked); visible token i sits at the i-th position
  that is not masked; ``max_tokens`` must be M, ``ignore_eos`` on, no stop strings / ids
  (an infill request always fills every mask).

Left-to-right continuation is the special case ``[P, P+1, ..., P+M-1]``. In the workers the
AS-ARM reads the request's position table (:func:`position_table`: visible positions, then
the masked ones in generation order) instead of the sequence index (patch
``asarm_infill_positions``); the front end checks every request (patch ``infill_requests``).

This module is the user side: :func:`make_request` turns a sequence with masks (``None`` or a
mask id; any number of spans) into prompt + extra args + max_tokens, :meth:`InfillRequest.merge`
puts the generated tokens back in positional order, :func:`generate` does both around
``LLM.generate``. It imports neither torch nor vLLM at module level.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

EXTRA_ARGS_KEY = "anyorder_infill"


class InfillError(ValueError):
    """A malformed infill request (refused before it reaches the engine)."""


@dataclass(frozen=True)
class InfillRequest:
    prompt_token_ids: tuple[int, ...]  # [P] the visible tokens, in positional order
    masked: tuple[int, ...]  # [M] the masked positions, in generation order

    @property
    def length(self) -> int:
        return len(self.prompt_token_ids) + len(self.masked)

    @property
    def max_tokens(self) -> int:
        return len(self.masked)

    @property
    def extra_args(self) -> dict[str, list[int]]:
        return {EXTRA_ARGS_KEY: list(self.masked)}

    def prompt(self) -> dict:
        """vLLM's ``TokensPrompt`` (a TypedDict) for ``LLM.generate``."""
        return {"prompt_token_ids": list(self.prompt_token_ids)}

    def openai_body(self, model: str, **sampling: Any) -> dict:
        """A ``/v1/completions`` body for this request (``return_token_ids`` on, so the
        response carries the generated ids for :meth:`merge`)."""
        return {"model": model, "prompt": list(self.prompt_token_ids),
                "max_tokens": self.max_tokens, "ignore_eos": True, "return_token_ids": True,
                "vllm_xargs": self.extra_args, **sampling}

    def merge(self, generated: Sequence[int]) -> list[int]:
        """The full sequence: visible tokens untouched, ``generated[j]`` at ``masked[j]``."""
        if len(generated) != len(self.masked):
            raise InfillError(f"expected {len(self.masked)} generated tokens, got "
                              f"{len(generated)}")
        table = position_table(len(self.prompt_token_ids), self.masked)
        out: list[int] = [0] * self.length
        for pos, tok in zip(table, list(self.prompt_token_ids) + list(generated)):
            out[pos] = int(tok)
        return out


def make_request(sequence: Sequence[int | None], mask_id: int | None = None,
                 order: Sequence[int] | None = None) -> InfillRequest:
    """``sequence``: token ids with masked entries (``None``, or equal to ``mask_id``).
    ``order``: the masked positions in generation order (default ascending: left to right,
    the sequential reference of ``core/assd.py``'s ``infill``)."""
    masked = [i for i, x in enumerate(sequence) if x is None or (mask_id is not None
                                                                  and x == mask_id)]
    if order is not None:
        if sorted(order) != masked:
            raise InfillError(f"order must list exactly the masked positions {masked}, got "
                              f"{list(order)}")
        masked = list(order)
    hidden = set(masked)
    visible = [int(x) for i, x in enumerate(sequence) if i not in hidden]
    request = InfillRequest(tuple(visible), tuple(masked))
    check(request.masked, len(visible))
    return request


def position_table(num_prompt: int, masked: Sequence[int]) -> list[int]:
    """Sequence index -> true position: the visible positions ascending, then ``masked``."""
    hidden = set(masked)
    n = num_prompt + len(masked)
    return [p for p in range(n) if p not in hidden] + list(masked)


def parse(extra_args: Any) -> list[int] | None:
    """The masked positions of a request's ``extra_args`` (None: not an infill request).
    Raises :class:`InfillError` when the entry is not a list of integers."""
    if not extra_args or EXTRA_ARGS_KEY not in extra_args:
        return None
    raw = extra_args[EXTRA_ARGS_KEY]
    if not isinstance(raw, (list, tuple)) or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in raw):
        raise InfillError(f"extra_args[{EXTRA_ARGS_KEY!r}] must be a list of integer "
                          f"positions (the masked positions in generation order), got {raw!r}")
    return list(raw)


def check(masked: Sequence[int], num_prompt: int, max_tokens: int | None = None,
          max_model_len: int | None = None) -> None:
    """Refuse a malformed request: no mask, no visible token, duplicate positions, positions
    outside the sequence [0, P + M), a sequence longer than the model's context, or a
    ``max_tokens`` other than the number of masks."""
    m = len(masked)
    n = num_prompt + m
    if m == 0:
        raise InfillError("an infill request needs at least one masked position")
    if num_prompt == 0:
        raise InfillError("an infill request needs at least one visible token")
    if len(set(masked)) != m:
        dup = sorted(p for p, c in Counter(masked).items() if c > 1)
        raise InfillError(f"masked positions must be distinct; repeated: {dup}")
    bad = [p for p in masked if not 0 <= p < n]
    if bad:
        raise InfillError(
            f"masked positions {bad} lie outside the sequence: {num_prompt} visible + {m} "
            f"masked tokens span positions 0..{n - 1}")
    if max_model_len is not None and n > max_model_len:
        raise InfillError(f"the infilled sequence ({n} tokens) exceeds max_model_len "
                          f"({max_model_len})")
    if max_tokens is not None and max_tokens != m:
        raise InfillError(f"max_tokens ({max_tokens}) must equal the number of masked "
                          f"positions ({m})")


def check_sampling(params: Any) -> None:
    """An infill request fills every mask: nothing may end it early."""
    if not getattr(params, "ignore_eos", False):
        raise InfillError("infill requests fill every masked position: set ignore_eos=True "
                          "(an EOS token is a legal fill, not the end of the request)")
    if getattr(params, "stop", None) or getattr(params, "stop_token_ids", None):
        raise InfillError("infill requests fill every masked position: stop strings and "
                          "stop_token_ids are not allowed")


def sampling_params(base: Any, request: InfillRequest) -> Any:
    """A copy of vLLM ``SamplingParams`` ``base`` for ``request``: max_tokens = masks,
    ignore_eos, and the request's extra args (merged into ``base.extra_args``)."""
    params = base.clone()
    params.max_tokens = request.max_tokens
    params.ignore_eos = True
    params.extra_args = {**(base.extra_args or {}), **request.extra_args}
    return params


def generate(llm: Any, sequences: Sequence[Sequence[int | None]], params: Any,
             mask_id: int | None = None) -> list[list[list[int]]]:
    """Fill every sequence with ``llm`` (an AS-ARM engine, with or without ``assd``):
    returns, per sequence, its ``params.n`` filled sequences in positional order."""
    requests = [make_request(s, mask_id) for s in sequences]
    outs = llm.generate([r.prompt() for r in requests],
                        [sampling_params(params, r) for r in requests], use_tqdm=False)
    return [[r.merge(c.token_ids) for c in o.outputs] for r, o in zip(requests, outs)]


def screen_request(params: Any, model_config: Any) -> list[int] | None:
    """Front-end check before tokenization (patch ``infill_requests``): the masked positions
    of an infill request on an AS-ARM with valid sampling settings, None for other requests."""
    masked = parse(getattr(params, "extra_args", None))
    if masked is None:
        return None
    from vllm_anyorder.families import is_asarm

    if not is_asarm(model_config.hf_config):
        raise InfillError(f"infill requests need an any-subset AR model (AS-ARM); "
                          f"{model_config.model!r} generates left to right only")
    check_sampling(params)
    return masked


def complete_request(request: Any, params: Any, masked: list[int], model_config: Any) -> None:
    """Front-end check after tokenization: ``max_tokens`` defaults to the number of masks;
    positions are checked against the tokenized prompt and ``max_model_len``."""
    sp = request.sampling_params
    if getattr(params, "max_tokens", None) is None:
        sp.max_tokens = len(masked)
    ids = request.prompt_token_ids
    if ids is None:
        raise InfillError("infill requests need token ids (no prompt embeds)")
    check(masked, len(ids), sp.max_tokens, model_config.max_model_len)
