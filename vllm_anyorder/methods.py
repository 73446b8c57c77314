"""The method table: speculative-config method name -> proposer class and model family.

vLLM 0.32 has no registry of speculative methods; its documented hook is
``method="custom_class"`` with ``model="<module>.<Class>"``. The plugin lets users write
``{"method": "jacobi", ...}`` and rewrites it to that hook at config time (``patches/front_end.py``).
Dispatch is by this table, never by if/elif chains. Imports neither torch nor vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_anyorder import config, families


@dataclass(frozen=True)
class MethodSpec:
    name: str
    config: type  # its typed options (``config.CONFIG_CLASSES[name]``)
    proposer: str  # dotted class path for vLLM's custom_class hook
    target_family: str  # "autoregressive" | "diffusion": which targets the method can serve
    paper: str
    # dotted path of ``check(cfg, target_model_config)`` run at start-up (raises
    # AnyOrderConfigError), for methods that load something besides the target
    startup_check: str = ""


_AR, _DLLM = "autoregressive", "diffusion"


def _spec(name: str, target_family: str, proposer: str, paper: str,
          startup_check: str = "") -> MethodSpec:
    """A row of the table; the config class is ``config.CONFIG_CLASSES[name]``."""
    return MethodSpec(name, config.CONFIG_CLASSES[name], proposer, target_family, paper,
                      startup_check)


METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        _spec("jacobi", _AR, "vllm_anyorder.proposers.jacobi.JacobiProposer",
              "pcLLM / Jacobi Forcing, Algorithm 1"),
        _spec("specdiff", _AR, "vllm_anyorder.proposers.specdiff.SpecDiffProposer",
              "SpecDiff (Christopher et al.), Sec. 4.1 / Algorithm 1",
              startup_check="vllm_anyorder.startup_checks.check_specdiff_drafter"),
        # left to right in vLLM; the target must also be an AS-ARM
        _spec("assd", _AR, "vllm_anyorder.proposers.assd.AssdProposer",
              "ASSD (Guo & Ermon), Sec. 5, Algorithm 1 / App. E.4 Algorithm 2",
              startup_check="vllm_anyorder.startup_checks.check_assd_target"),
        # the dLLM baseline; what a dLLM without speculative config runs
        _spec("stepwise", _DLLM, "vllm_anyorder.proposers.dllm.StepwiseProposer",
              "LLaDA semi-autoregressive remasking (SSD Sec. 3.1, FreeDave Algorithm 1)"),
        _spec("ssd", _DLLM, "vllm_anyorder.proposers.dllm.SsdProposer",
              "SSD (Gao et al.), Sec. 3.2 / App. A Algorithm 1, mix-order Sec. 5.2"),
        _spec("freedave", _DLLM, "vllm_anyorder.proposers.dllm.FreeDaveProposer",
              "FreeDave (Wu & Zhang), Sec. 3.2 / Algorithm 2"),
    )
}

# what a diffusion target runs when the user gives no speculative config
DIFFUSION_DEFAULT = "stepwise"

BY_PROPOSER: dict[str, MethodSpec] = {spec.proposer: spec for spec in METHODS.values()}


def lookup(method: str | None, model: str | None) -> MethodSpec | None:
    """The plugin method named by a speculative config, or None if it is not ours."""
    if method in METHODS:
        return METHODS[method]
    if model in BY_PROPOSER and method in (None, "custom_class"):
        return BY_PROPOSER[model]
    return None


def target_family(architectures: list[str] | None, model_type: str | None) -> str:
    """Which methods a target can serve: a diffusion model (a served dLLM or another
    diffusion format) only the dLLM methods, anything else the AR methods."""
    return "diffusion" if families.is_diffusion(architectures, model_type) else "autoregressive"
