"""The contract between vLLM's model runner hooks and an anyorder proposer.

The runner side (the ``verification_hook`` and ``draft_probs`` patches, the only code that
holds vLLM's ``GPUModelRunner``) builds one :class:`RunnerView` per engine step and hands it
to a proposer that is a :class:`VerificationObserver`; it asks a :class:`DraftProbsSource`
for draft probabilities after ``propose``. Proposers read the batch through the view and
never touch the runner. A proposer whose drafts should not all teach the speculation budget
hands it a :class:`BudgetCounting` rule. vLLM field meanings per method: ``docs/CONTRACTS.md``.

Bottom layer: imports neither torch, vLLM nor another plugin module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, runtime_checkable


@dataclass(frozen=True)
class RunnerView:
    """What the runner offers a proposer during one engine step (read-only references to
    the runner's live objects; valid until the step's ``propose`` returns).

    Rows are the input batch's rows: ``req_ids[i]`` is row i of ``propose``'s lists, of
    ``block_table`` and of the per-row arrays."""

    input_batch: Any  # vLLM InputBatch (rows, token ids, block tables, sampling metadata)
    requests: Mapping[str, Any]  # req_id -> CachedRequestState (prompt length, params)
    _attn_groups: Any  # runner.attn_groups: [kv cache group][attention group]

    @classmethod
    def of(cls, runner: Any) -> "RunnerView":
        return cls(runner.input_batch, getattr(runner, "requests", {}),
                   getattr(runner, "attn_groups", None))

    @property
    def req_ids(self) -> list[str]:
        return list(self.input_batch.req_ids)

    @property
    def block_table(self) -> Any:
        """The block table of KV-cache group 0 (the plugin's models have one group)."""
        return self.input_batch.block_table[0]

    @property
    def token_ids_cpu(self) -> Any:  # [max rows, max_model_len] int32 numpy
        return self.input_batch.token_ids_cpu

    @property
    def num_tokens_no_spec(self) -> Any:  # [rows] tokens per row without drafts
        return self.input_batch.num_tokens_no_spec

    @property
    def num_computed_tokens(self) -> Any:  # [rows] tokens with K/V before this step
        return self.input_batch.num_computed_tokens_cpu

    @property
    def sampling_metadata(self) -> Any:  # temperature / top-k / top-p / generators per row
        return self.input_batch.sampling_metadata

    def metadata_builder(self) -> Any:
        """The attention metadata builder of group 0 (builds the plugin's extra forwards)."""
        return self._attn_groups[0][0].get_metadata_builder()


@runtime_checkable
class VerificationObserver(Protocol):
    def observe_verification(self, view: RunnerView, logits: Any,
                             spec_decode_metadata: Any) -> None:
        """Called before vLLM samples with the target's logits of every verified row
        (``[sum(num_draft + 1), V]``, request-major in ``view.req_ids`` order); may overwrite
        them in place (the dLLM methods do)."""


@runtime_checkable
class DraftProbsSource(Protocol):
    def take_draft_probs(self) -> tuple[list[str], Any] | None:
        """(req_ids, probs ``[R, K, V]`` float32) of the last ``propose``, or None."""


_CLASS_IMPLEMENTS: dict[tuple[type, type], bool] = {}


def implements(obj: Any, protocol: type) -> bool:
    """``isinstance(obj, protocol)`` for the runner hooks' per-step checks, for a protocol of
    methods (not :class:`BudgetCounting`). A runtime-checkable protocol's ``isinstance``
    looks up every member on each call (6-13 us on CPython 3.11, three to four times a step,
    in engines without speculation too); here a class that has them all answers from a
    cache, and so does an object that cannot hold them itself (no instance ``__dict__``, or
    none of them in it); anything else asks ``isinstance``."""
    cls = type(obj)
    members = _methods(protocol)
    hit = _CLASS_IMPLEMENTS.get((cls, protocol))
    if hit is None:
        hit = _CLASS_IMPLEMENTS[(cls, protocol)] = all(hasattr(cls, m) for m in members)
    if hit:
        return True
    own = getattr(obj, "__dict__", None)
    if not own or not any(m in own for m in members):
        return False if not hasattr(cls, "__getattr__") else isinstance(obj, protocol)
    return isinstance(obj, protocol)


_METHODS: dict[type, tuple[str, ...]] = {}


def _methods(protocol: type) -> tuple[str, ...]:
    found = _METHODS.get(protocol)
    if found is None:
        found = _METHODS[protocol] = tuple(n for n, v in vars(protocol).items()
                                           if callable(v) and not n.startswith("_"))
    return found


# (req_id, drafts verified, drafts accepted) of one request in one step
Outcome = tuple[str, int, int]


@runtime_checkable
class BudgetCounting(Protocol):
    """Which verified drafts the speculation budget learns acceptance from
    (``AnyOrderProposer.budget_counting``; e.g. ``core.jacobi_refined.RefinedPositions``)."""

    probe_hold: int  # steps an upward probe of the budget keeps its depth
    # drafts that improve only where verified (Jacobi iterates): cold everywhere after plain
    # steps, so a probe from plain decoding does not reach past the nearest depth, and the
    # realised rates of a retry after plain steps do not overrule the model
    cold_after_plain: bool

    def counted(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Of a step's outcomes, what counts (each (req_id, drafted, accepted) possibly cut)."""

    def plain_step(self, req_ids: tuple[str, ...]) -> None:
        """``counted`` of a step in which no request drafted, without its outcome list."""

    def forget(self, live: set[str]) -> None:
        """Drop the state of requests no longer in the batch."""
