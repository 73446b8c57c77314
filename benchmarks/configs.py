"""Benchmark configurations of every method, built one way for every benchmark script."""

from __future__ import annotations

from pathlib import Path

from benchmarks.common import REPO
from benchmarks.compare import Config, assd_probe, dllm_probe, drafter_probe
from vllm_anyorder import methods

AR_DRAFTER = REPO / "models" / "ar-drafter"
MDLM_DRAFTER = REPO / "models" / "mdlm-drafter"
MDLM_DISTILLED = REPO / "models" / "mdlm-drafter-distilled"  # distilled from ar-target-large
ASARM = REPO / "models" / "asarm"
LLADA = REPO / "models" / "llada-dllm"
# the dLLM methods that draft (the method table's diffusion rows but ``stepwise``)
DLLM_DRAFTING = tuple(name for name, spec in methods.METHODS.items()
                      if spec.target_family == "diffusion" and name != methods.DIFFUSION_DEFAULT)
DLLM_BLOCK = 32  # the dLLM benchmarks' block length (steps per block: 0 = the block length)


def no_spec() -> Config:
    return Config("no-spec")


def ngram(k: int) -> Config:
    return Config(f"ngram k={k}", {"method": "ngram", "num_speculative_tokens": k,
                                   "prompt_lookup_max": 3, "prompt_lookup_min": 1},
                  family="ngram", k=k)


def draft_model(k: int, drafter: Path = AR_DRAFTER) -> Config:
    return Config(f"draft_model k={k}", {"method": "draft_model", "model": str(drafter),
                                         "num_speculative_tokens": k},
                  family="draft_model (AR drafter)", k=k)


def jacobi(n: int, blocks: int = 2, model: Path | None = None, label: str = "",
           step_drafts: int = 0) -> Config:
    label = (f" step_drafts={step_drafts}" if step_drafts else "") + label
    family = f"jacobi K={blocks}{label}"
    options = {"num_blocks": blocks, **({"step_drafts": step_drafts} if step_drafts else {})}
    return Config(f"jacobi n={n} K={blocks}{label}", {"method": "jacobi", "num_speculative_tokens": n},
                  {"anyorder": {"jacobi": options}}, model=model, family=family, k=n)


def specdiff(gamma: int, steps: int, drafter: Path = MDLM_DRAFTER, label: str = "",
             window: int = 0) -> Config:
    """``window`` 0: the drafter's whole length minus gamma (the method's default)."""
    label = (f" W={window}" if window else "") + label
    return Config(f"specdiff gamma={gamma} T={steps}{label}",
                  {"method": "specdiff", "model": str(drafter), "num_speculative_tokens": gamma},
                  {"anyorder": {"specdiff": {"steps": steps, "context_window": window}}},
                  probe=drafter_probe,
                  family=f"specdiff T={steps}{label}", k=gamma)


def assd(k: int, drafter: str = "self", model: Path = ASARM,
         reference: str = "no-spec (asarm)") -> Config:
    """``assd`` on an AS-ARM, compared with the same AS-ARM served without speculation."""
    return Config(f"assd {drafter} k={k}", {"method": "assd", "num_speculative_tokens": k},
                  {"anyorder": {"assd": {"drafter": drafter}}}, model=model, probe=assd_probe,
                  family=f"assd {drafter}", k=k, reference=reference)


def dllm(name: str, method: str, k: int = 0, budget: str = "fixed", block: int = DLLM_BLOCK,
         steps: int = 0, **extra) -> Config:
    """A diffusion-LLM policy (on the benchmark's target, ``LLADA`` by default): ``stepwise`` (the baseline, no
    speculative config), ``ssd`` with N = ``k`` nodes or ``freedave`` with d = ``k``."""
    spec = None if method == "stepwise" else {"method": method, "num_speculative_tokens": k}
    label = "" if method == "stepwise" else f" {budget}"
    options = {"block_length": block, "steps_per_block": steps, **extra, "budget": budget}
    return Config(name + label, spec, {"anyorder": {method: options}},
                  probe=dllm_probe, family=name.split(" ")[0] + label, k=k)
