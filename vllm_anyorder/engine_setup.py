"""Start-up resolution of a plugin method: validate, then map onto vLLM's custom_class hook.

Runs in the front-end process (``LLM(...)`` or ``vllm serve``) from the ``method_names``
patch, before vLLM builds ``SpeculativeConfig`` and before any engine process exists, so bad
input fails at start-up with nothing half-started.
"""

from __future__ import annotations

import copy
import importlib
import logging
import os
from typing import Any

from vllm_anyorder import config, exactness, methods

logger = logging.getLogger("vllm_anyorder")

_ARTICLE = {"autoregressive": "an", "diffusion": "a"}
# Keys of additional_config["anyorder"] that are not per-method option blocks.
_SECTION_KEYS = {"resolved"}


def resolve(spec: dict[str, Any], additional: dict[str, Any] | None, target_model_config):
    """Return (speculative_config dict for vLLM, additional_config) for a plugin method;
    other methods pass through untouched."""
    spec = {k.replace("-", "_"): v for k, v in spec.items()}
    method = methods.lookup(spec.get("method"), spec.get("model"))
    if method is None:
        if _family(target_model_config) == "diffusion":
            raise config.AnyOrderConfigError(
                f"speculative method {spec.get('method')!r} cannot serve the diffusion model "
                f"{getattr(target_model_config, 'model', '?')!r}; use one of "
                f"{[m.name for m in methods.METHODS.values() if m.target_family == 'diffusion']}"
                f" (or no speculative config: '{methods.DIFFUSION_DEFAULT}')")
        return spec, additional
    additional = copy.deepcopy(additional) if additional else {}
    section = config.section(additional)
    unknown = sorted(set(section) - set(config.CONFIG_CLASSES) - _SECTION_KEYS)
    if unknown:
        raise config.AnyOrderConfigError(
            f"unknown key(s) {unknown} in additional_config['anyorder']; "
            f"expected method names {sorted(config.CONFIG_CLASSES)}"
        )
    _check_target(method, target_model_config)
    exactness.check(method.name, spec)
    if section.get("resolved") == method.name and spec.get("method") == "custom_class":
        # already resolved (the same EngineArgs building a config twice): keep it as is
        cfg = config.load(additional, method.name)
        if spec.get("num_speculative_tokens") != cfg.chain_length:
            raise config.AnyOrderConfigError(
                f"resolved '{method.name}' options do not match num_speculative_tokens="
                f"{spec.get('num_speculative_tokens')}; pass the block size, not the chain length"
            )
        return spec, additional
    cfg = _parse(method, spec, section.get(method.name))
    if method.startup_check:
        module, _, func = method.startup_check.rpartition(".")
        getattr(importlib.import_module(module), func)(cfg, target_model_config)
    config.store(additional, method.name, cfg)
    engine_k = cfg.chain_length
    resolved = {
        **spec,
        "method": "custom_class",
        "model": method.proposer,
        "num_speculative_tokens": engine_k,
    }
    logger.info(
        "vllm_anyorder: method=%s -> custom_class %s, %s, vLLM verifies up to %d drafts/step",
        method.name, method.proposer, cfg, engine_k,
    )
    return resolved, additional


def _parse(method: methods.MethodSpec, spec: dict[str, Any], options: Any):
    """Typed config from the user's options plus the speculative-config fields the method
    takes over (``FROM_SPEC``: e.g. gamma from ``num_speculative_tokens``, the drafter
    directory from ``model``)."""
    cls = method.config
    k = spec.get("num_speculative_tokens")
    if "num_speculative_tokens" not in cls.FROM_SPEC:  # the block length sets vLLM's k
        if k is not None:
            raise config.AnyOrderConfigError(
                f"method '{method.name}' takes no num_speculative_tokens (vLLM's draft count "
                f"follows its block_length option)")
        return config.parse(method.name, options)
    if k is None:
        k = getattr(cls(), cls.FROM_SPEC["num_speculative_tokens"])
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise config.AnyOrderConfigError(
            f"num_speculative_tokens must be a positive integer for '{method.name}', got {k!r}"
        )
    if k > config.MAX_SPEC_LEN:
        raise config.AnyOrderConfigError(
            f"num_speculative_tokens={k} exceeds vLLM's limit of {config.MAX_SPEC_LEN} "
            f"drafts verified per step (MAX_SPEC_LEN); use a value <= {config.MAX_SPEC_LEN}"
        )
    if options is not None and not isinstance(options, dict):
        raise config.AnyOrderConfigError(
            f"additional_config['anyorder']['{method.name}'] must be a JSON object"
        )
    derived = {"num_speculative_tokens": k}
    if "model" in cls.FROM_SPEC:
        derived["model"] = _drafter_path(method, spec.get("model"))
    return config.parse(
        method.name, options, **{cls.FROM_SPEC[key]: v for key, v in derived.items()}
    )


def _drafter_path(method: methods.MethodSpec, model: Any) -> str:
    """The drafter directory named by ``speculative_config.model``, made absolute so every
    worker (another cwd, a Ray node with the same layout) opens the same directory."""
    if not isinstance(model, str) or not model or model == method.proposer:
        raise config.AnyOrderConfigError(
            f"method '{method.name}' needs speculative_config.model = the drafter's directory"
        )
    return os.path.abspath(os.path.expanduser(model))


def default_spec(target_model_config) -> dict[str, Any] | None:
    """The speculative config a target gets when the user gives none: diffusion LLMs always
    decode through the plugin (their baseline is ``stepwise``); other models get none."""
    if _family(target_model_config) == "diffusion":
        return {"method": methods.DIFFUSION_DEFAULT}
    return None


def _family(model_config) -> str:
    hf = getattr(model_config, "hf_config", None)
    return methods.target_family(getattr(hf, "architectures", None),
                                 getattr(hf, "model_type", None))


def _check_target(method: methods.MethodSpec, model_config) -> None:
    hf = getattr(model_config, "hf_config", None)
    family = _family(model_config)
    runner = getattr(model_config, "runner_type", "generate")
    if runner != "generate":
        raise config.AnyOrderConfigError(
            f"method '{method.name}' needs a generative model; {model_config.model!r} runs as "
            f"'{runner}'"
        )
    if family != method.target_family:
        raise config.AnyOrderConfigError(
            f"method '{method.name}' needs {_ARTICLE[method.target_family]} "
            f"{method.target_family} target, but "
            f"{model_config.model!r} ({getattr(hf, 'architectures', None)}) is a {family} model"
        )


# vLLM's shorthand flags (``--spec-method`` ...; ``EngineArgs.spec_method`` ...) and the
# speculative-config key each sets, as vLLM's ``create_speculative_config`` merges them
SHORTHAND = (("--spec-method", "spec_method", "method"),
             ("--spec-model", "spec_model", "model"),
             ("--spec-tokens", "spec_tokens", "num_speculative_tokens"))


def merge_shorthand(engine_args: Any) -> None:
    """Fold vLLM's shorthand flags into ``engine_args.speculative_config``, by vLLM's own
    rule (a flag and the same key in the dict are mutually exclusive: ValueError), so a
    plugin method named by ``--spec-method`` is resolved exactly like one named in
    ``--speculative-config``. The flags are then cleared: vLLM's original would merge them
    again (and refuse the now present keys). The user's dict is copied, not mutated; its
    dash keys are normalised first, so ``num-speculative-tokens`` also clashes."""
    spec = engine_args.speculative_config
    for flag, attr, key in SHORTHAND:
        value = getattr(engine_args, attr, None)
        if value is None:
            continue
        spec = {k.replace("-", "_"): v for k, v in (spec or {}).items()}
        if key in spec:
            raise ValueError(f"{flag} and --speculative-config['{key}'] are mutually exclusive")
        spec[key] = value
        setattr(engine_args, attr, None)
    engine_args.speculative_config = spec


def on_speculative_config(engine_args: Any, target_model_config: Any) -> None:
    """Called by patch ``method_names`` just before vLLM builds ``SpeculativeConfig``: the
    shorthand flags are merged first (:func:`merge_shorthand`); a diffusion LLM without a
    speculative config gets ``stepwise`` (its only decoding path in vLLM); a plugin method's
    dict is validated and rewritten (:func:`resolve`)."""
    merge_shorthand(engine_args)
    if engine_args.speculative_config is None:
        engine_args.speculative_config = default_spec(target_model_config)
    if isinstance(engine_args.speculative_config, dict):
        engine_args.speculative_config, engine_args.additional_config = resolve(
            engine_args.speculative_config, engine_args.additional_config, target_model_config)
