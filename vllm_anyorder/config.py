"""Typed per-method options, parsed and validated in one place.

Users pass options as ``--additional-config '{"anyorder": {"<method>": {...}}}'`` (or
``LLM(additional_config={"anyorder": {...}})``). :func:`resolve` runs once in the front-end
process when the engine config is built (see ``patches/front_end.py``), rejects bad input before any
engine process starts, and writes the normalised options back into ``additional_config`` so
every worker (mp, Ray, each TP rank) parses the identical dictionary with :func:`load`.

This module imports neither torch nor vLLM.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Mapping

from vllm_anyorder.core.assd_drafters import DRAFTERS as ASSD_DRAFTERS
from vllm_anyorder.core.assd_drafters import AssdDrafter

ANYORDER_KEY = "anyorder"
MAX_SPEC_LEN = 128  # vLLM 0.32 rejection sampler limit (v1/sample/rejection_sampler.py)


class AnyOrderConfigError(ValueError):
    """Bad plugin configuration; raised at engine start-up, never mid-request."""


@dataclass(frozen=True)
class BudgetedConfig:
    """The option every method has: ``budget`` -- how many of the configured drafts a step
    really verifies. ``auto`` (default): chosen each step from measured step cost and
    acceptance, zero included (``core/budget.py``); the configured sizes are the maximum.
    ``fixed``: the configured sizes every step (the method exactly as configured).
    ``cycle:a,b,...``: a test hook, per-request caps a, b, ... in turn."""

    budget: str = "auto"

    def validate_budget(self) -> None:
        from vllm_anyorder.core.budget_settings import parse_mode

        try:
            parse_mode(self.budget)
        except ValueError as exc:
            raise AnyOrderConfigError(str(exc)) from None


@dataclass(frozen=True)
class JacobiConfig(BudgetedConfig):
    """Options of ``method="jacobi"`` (defaults: K=2, pool 4, r=0.85 as the paper recommends;
    n=16 rather than the paper's 64, because under the speculation budget n is only the
    longest chain and 16 is where ``auto`` measured best, at every batch size: 2.77x vs 1.87x
    no speculation at batch 1, 0.97x vs 0.71x at batch 16, benchmarks/RESULTS.md;
    ``block_size`` comes from ``num_speculative_tokens``)."""

    # speculative-config key -> option it sets (users may not set those options twice)
    FROM_SPEC: ClassVar[dict[str, str]] = {"num_speculative_tokens": "block_size"}

    block_size: int = 16
    num_blocks: int = 2
    pool_size: int = 4
    spawn_ratio: float = 0.85
    recycle: str = "pool_first"
    step_drafts: int = 0  # drafts per engine step over the whole batch; 0 = no limit

    def validate(self) -> None:
        from vllm_anyorder.core.jacobi import RECYCLE_RULES

        self.validate_budget()
        _check_range("block_size (num_speculative_tokens)", self.block_size, 1, MAX_SPEC_LEN)
        _check_range("num_blocks", self.num_blocks, 1, 8)
        _check_range("pool_size", self.pool_size, 0, 64)
        _check_range("step_drafts", self.step_drafts, 0, 1 << 20)
        ratio = self.spawn_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 < ratio <= 1.0:
            raise AnyOrderConfigError(f"jacobi.spawn_ratio must be in (0, 1], got {self.spawn_ratio!r}")
        if self.recycle not in RECYCLE_RULES:
            raise AnyOrderConfigError(
                f"jacobi.recycle must be one of {list(RECYCLE_RULES)}, got {self.recycle!r}"
            )

    @property
    def chain_length(self) -> int:
        """vLLM ``num_speculative_tokens`` the engine is given: K blocks, at most 128."""
        return min(MAX_SPEC_LEN, self.block_size * self.num_blocks)


DRAFTER_DTYPES = ("auto", "float32", "bfloat16", "float16")
UNMASK_SCHEDULES = ("confidence", "left_to_right", "random")


@dataclass(frozen=True)
class SpecDiffConfig(BudgetedConfig):
    """Options of ``method="specdiff"`` (SpecDiff, Christopher et al., Sec. 4.1 / Algorithm 1).

    ``num_draft_tokens`` (gamma) comes from ``num_speculative_tokens`` and ``drafter`` (the
    masked-diffusion model directory) from the speculative config's ``model``. ``steps`` is T,
    the number of denoising forwards per draft; ``context_window`` 0 means "as much context as
    the drafter's trained length leaves after gamma masks"; ``temperature`` 0 drafts the
    drafter's argmax (any value is lossless: drafts are verified as point masses).
    """

    FROM_SPEC: ClassVar[dict[str, str]] = {
        "num_speculative_tokens": "num_draft_tokens",
        "model": "drafter",
    }

    drafter: str = ""
    num_draft_tokens: int = 16
    steps: int = 4
    context_window: int = 0
    schedule: str = "confidence"
    temperature: float = 0.0
    dtype: str = "auto"
    seed: int = 0

    def validate(self) -> None:
        self.validate_budget()
        if not isinstance(self.drafter, str) or not self.drafter:
            raise AnyOrderConfigError(
                "specdiff needs a drafter: set speculative_config.model to the directory of a "
                "masked-diffusion model (MDLM or SEDD format)"
            )
        _check_range("num_draft_tokens (num_speculative_tokens)", self.num_draft_tokens, 1,
                     MAX_SPEC_LEN)
        _check_range("specdiff.steps", self.steps, 1, self.num_draft_tokens)
        _check_range("specdiff.context_window", self.context_window, 0, 1 << 20)
        _check_choice("specdiff.schedule", self.schedule, UNMASK_SCHEDULES)
        _check_choice("specdiff.dtype", self.dtype, DRAFTER_DTYPES)
        temp = self.temperature
        if isinstance(temp, bool) or not isinstance(temp, (int, float)) or not 0.0 <= temp <= 10.0:
            raise AnyOrderConfigError(
                f"specdiff.temperature must be a number in [0, 10], got {self.temperature!r}")
        _check_range("specdiff.seed", self.seed, 0, 2**31 - 1)

    @property
    def chain_length(self) -> int:
        return self.num_draft_tokens


# method name -> config class; the method table in methods.py refers to these.


def _check_range(name: str, value: Any, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise AnyOrderConfigError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise AnyOrderConfigError(f"{name} must be one of {list(choices)}, got {value!r}")


def parse(method: str, options: Mapping[str, Any] | None, **derived: Any):
    """Build and validate the typed config of ``method`` from user options.

    ``derived`` carries values the plugin takes from vLLM's own fields (the config class's
    ``FROM_SPEC``, e.g. ``block_size`` from ``num_speculative_tokens``); users may not set
    those twice.
    """
    cls = CONFIG_CLASSES[method]
    options = dict(options or {})
    valid = [f.name for f in fields(cls)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise AnyOrderConfigError(
            f"unknown option(s) {unknown} for method '{method}'; valid options: {valid}"
        )
    clash = sorted(set(options) & set(derived))
    if clash:
        raise AnyOrderConfigError(
            f"option(s) {clash} of method '{method}' come from the speculative config "
            f"({sorted(cls.FROM_SPEC)}); do not set them in additional_config"
        )
    cfg = cls(**{**options, **derived})
    cfg.validate()
    return cfg


def section(additional_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The plugin's part of ``additional_config`` (an empty dict when absent)."""
    sec = (additional_config or {}).get(ANYORDER_KEY)
    if sec is None:
        return {}
    if not isinstance(sec, Mapping):
        raise AnyOrderConfigError(f"additional_config['{ANYORDER_KEY}'] must be a JSON object")
    return dict(sec)


def store(additional_config: dict[str, Any], method: str, cfg: Any) -> None:
    """Write the resolved config back so workers read exactly what the front-end checked."""
    sec = section(additional_config)
    sec[method] = dataclasses.asdict(cfg)
    sec["resolved"] = method
    additional_config[ANYORDER_KEY] = sec


def load(additional_config: Mapping[str, Any] | None, method: str, **fallback: Any):
    """Read the resolved config in a worker. ``fallback`` fills derived values when the
    front-end did not run the plugin (e.g. plugins disabled there by ``VLLM_PLUGINS``)."""
    sec = section(additional_config)
    opts = dict(sec.get(method) or {})
    if sec.get("resolved") == method:
        return parse(method, opts)
    derived = {k: v for k, v in fallback.items() if k not in opts}
    return parse(method, opts, **derived)




@dataclass(frozen=True)
class AssdConfig(BudgetedConfig):
    """Options of ``method="assd"`` (Any-Subset Speculative Decoding, Guo & Ermon, Sec. 5).

    ``k`` comes from ``num_speculative_tokens``: drafts per round. ``drafter`` ``self`` is
    Algorithm 1 (one forward of the AS-ARM's query stream drafts k positions at once, each
    given the decoded prefix), ``ngram`` Algorithm 2 (context-bigram counts, no forward).
    ``seed`` seeds draft sampling of unseeded requests (identical on every TP rank).

    Defaults: ``ngram``, k = 8, the measured best on the CPUs this project runs on (2 Zen 4
    cores, bf16, 2026-11-26: fixed ngram k=8 1.91x no speculation at batch 1, k=3 1.73x,
    against 1.06-1.22x for ``self`` k=3-5, whose drafting forward costs as much as the
    verifying one there; benchmarks/RESULTS.md). Under the speculation budget k is only
    the longest chain. ``self`` is the paper's main algorithm; choose it where a forward's
    cost hardly grows with its rows (a GPU) and the text repeats little.

    With ``self`` a round is two forwards (draft, verify) that commit at least two tokens
    (Lemma 1: the first draft is always accepted) plus up to k - 1 more; at k = 1 a round
    commits exactly two tokens, i.e. no fewer forwards than sequential decoding, so k = 1 is
    refused (the paper, Sec. 5 / App. E: "always set k > 2"; vLLM's bonus token lets k = 2
    commit up to three tokens per round, which start-up accepts with a warning).
    """

    FROM_SPEC: ClassVar[dict[str, str]] = {"num_speculative_tokens": "k"}

    k: int = 8
    drafter: str = "ngram"
    seed: int = 0

    def validate(self) -> None:
        self.validate_budget()
        _check_range("k (num_speculative_tokens)", self.k, 1, MAX_SPEC_LEN)
        _check_choice("assd.drafter", self.drafter, tuple(ASSD_DRAFTERS))
        _check_range("assd.seed", self.seed, 0, 2**31 - 1)
        if self.drafter_kind.queries_target and self.k < 2:
            raise AnyOrderConfigError(
                "assd with the self drafter needs num_speculative_tokens >= 2: each round "
                "is a drafting forward plus a verifying forward, and with k = 1 it commits "
                "exactly 2 tokens (the exact first draft + 1), no fewer forwards than "
                "sequential decoding (Guo & Ermon, Sec. 5: set k > 2)")

    @property
    def drafter_kind(self) -> AssdDrafter:
        return ASSD_DRAFTERS[self.drafter]

    @property
    def chain_length(self) -> int:
        return self.k




DLLM_REMASKING = ("low_confidence", "random")  # == core.dllm_blocks.REMASKING (torch-free)


@dataclass(frozen=True)
class StepwiseConfig(BudgetedConfig):
    """Options of the dLLM baseline, ``method="stepwise"`` (what a LLaDA / Dream model served
    without a speculative config runs): semi-autoregressive blocks of ``block_length`` masked
    positions, ``steps_per_block`` denoising steps each (0 = one token per step), LLaDA's
    ``remasking`` rule. vLLM carries one block per engine step: ``block_length - 1`` drafts."""

    FROM_SPEC: ClassVar[dict[str, str]] = {}

    block_length: int = 32
    steps_per_block: int = 0
    remasking: str = "low_confidence"

    def validate(self) -> None:
        self.validate_budget()
        _check_range("block_length", self.block_length, 2, MAX_SPEC_LEN + 1)
        _check_range("steps_per_block", self.steps_per_block, 0, self.block_length)
        _check_choice("remasking", self.remasking, DLLM_REMASKING)

    @property
    def steps(self) -> int:
        return self.steps_per_block or self.block_length

    @property
    def chain_length(self) -> int:
        return self.block_length - 1


@dataclass(frozen=True)
class SsdConfig(StepwiseConfig):
    """``method="ssd"`` (Gao et al., Sec. 3.2 / App. A Algorithm 1): ``draft_length`` N (from
    ``num_speculative_tokens``) drafted steps verified as a chain of N + 1 nodes in one batched
    forward; ``mix_order`` adds the Sec. 5.2 out-of-order nodes; drafts may reach
    ``lookahead_blocks`` blocks ahead."""

    FROM_SPEC: ClassVar[dict[str, str]] = {"num_speculative_tokens": "draft_length"}

    draft_length: int = 4
    mix_order: bool = False
    lookahead_blocks: int = 1

    def validate(self) -> None:
        super().validate()
        _check_range("ssd.draft_length (num_speculative_tokens)", self.draft_length, 1, 32)
        _check_range("ssd.lookahead_blocks", self.lookahead_blocks, 0, 2)
        if not isinstance(self.mix_order, bool):
            raise AnyOrderConfigError(f"ssd.mix_order must be true or false, got {self.mix_order!r}")


@dataclass(frozen=True)
class FreeDaveConfig(StepwiseConfig):
    """``method="freedave"`` (Wu & Zhang, Sec. 3.2 / Algorithm 2): candidates for the next
    ``draft_steps`` d steps (from ``num_speculative_tokens``) drafted by the remasking scheduler
    and verified in the next batched forward."""

    FROM_SPEC: ClassVar[dict[str, str]] = {"num_speculative_tokens": "draft_steps"}

    draft_steps: int = 4
    lookahead_blocks: int = 1

    def validate(self) -> None:
        super().validate()
        _check_range("freedave.draft_steps (num_speculative_tokens)", self.draft_steps, 1, 32)
        _check_range("freedave.lookahead_blocks", self.lookahead_blocks, 0, 2)


# method name -> config class (``methods.METHODS[name].config`` is the same class)
CONFIG_CLASSES: dict[str, type] = {
    "jacobi": JacobiConfig, "specdiff": SpecDiffConfig, "assd": AssdConfig,
    "stepwise": StepwiseConfig, "ssd": SsdConfig, "freedave": FreeDaveConfig,
}
