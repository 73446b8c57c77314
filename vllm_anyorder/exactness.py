"""The start-up guard on the lossless promise: verification settings a plugin method refuses.

Every plugin method is exact only under vLLM's ``standard`` rejection sampler: keep draft d
with probability min(1, p(d) / q(d)) (q a point mass, or ``assd``'s handed-over q), else
sample the residual (p - q)+; greedy requests keep d iff it is the argmax. vLLM's
``SpeculativeConfig`` has settings that change that rule or how many drafts it verifies;
for a plugin method they are refused here, in the front-end (``engine_setup.resolve``),
with the setting named and why. What was checked and decided for every other field of
``SpeculativeConfig`` (vLLM 0.32.0 and 0.33.0): ``docs/CONTRACTS.md``, "Verification
settings". Imports neither torch nor vLLM.
"""

from __future__ import annotations

from typing import Any

from vllm_anyorder.config import AnyOrderConfigError

EXACT_RULE = "standard"

# why each rejection_sample_method other than "standard" is refused (vLLM 0.32: standard,
# synthetic, block; 0.33 adds fly). Any other value is refused too (a future rule is not
# exact until shown to be).
_RULES = {
    "synthetic": "it accepts drafts with made-up acceptance rates "
                 "(synthetic_acceptance_rates / _length), not with the target's p(d), so the "
                 "outputs are no longer the target's (a benchmarking aid)",
    "fly": "FLy's entropy-gated deferred acceptance keeps drafts the target would reject "
           "(lossy by design)",
    "block": "block verification (Sun et al.) exists only in vLLM's V2 model runner, which "
             "plugin methods never run on (the V1 runner ignores the setting and verifies "
             "token by token), and it has not been shown exact with any plugin method's "
             "drafts (docs/CONTRACTS.md)",
}

# settings refused when not at their default, with why
_NOT_DEFAULT = {
    "num_speculative_tokens_per_batch_size": (
        None,
        "dynamic speculative decoding changes how many drafts vLLM verifies per step with "
        "the batch size, but plugin methods fix that count themselves (jacobi's chain of "
        "n*K, a diffusion LLM's whole block of block_length - 1 positions committed in one "
        "step): a smaller count would cut a decided dLLM block and change its output "
        "(vLLM 0.33 drops the setting for custom_class methods with a warning)"),
}


def check(method: str, spec: dict[str, Any]) -> None:
    """Refuse (``AnyOrderConfigError``) any verification setting in the speculative-config
    dict ``spec`` (keys normalised to underscores) under which plugin method ``method``
    would not be exact."""
    rule = spec.get("rejection_sample_method")
    if rule is not None and rule != EXACT_RULE:
        why = _RULES.get(rule, "only 'standard' is known to be exact")
        raise AnyOrderConfigError(
            f"speculative_config.rejection_sample_method={rule!r} is refused for method "
            f"'{method}': {why}. Plugin methods are lossless only under "
            f"rejection_sample_method='{EXACT_RULE}' (the default; leave it unset)")
    for key, (default, why) in _NOT_DEFAULT.items():
        value = spec.get(key, default)
        if value != default:
            raise AnyOrderConfigError(
                f"speculative_config.{key}={value!r} is refused for method '{method}': "
                f"{why}. Leave it unset")
