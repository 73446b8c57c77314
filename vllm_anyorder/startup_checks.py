"""Method-specific start-up checks (front-end process): the method table's ``startup_check``.

Run by ``engine_setup.resolve`` before any engine process starts, so a target that cannot do
the method, a wrong drafter directory, a vocabulary or tokenizer that does not match the
target, or a window that does not fit the drafter fails with a clear message instead of a
crash in the worker. Reads JSON only (no weights are loaded here).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from vllm_anyorder import families
from vllm_anyorder.config import AnyOrderConfigError, AssdConfig, SpecDiffConfig

logger = logging.getLogger("vllm_anyorder")


def check_specdiff_drafter(cfg: SpecDiffConfig, target_model_config: Any) -> None:
    """The masked-diffusion drafter must be a readable MDLM/SEDD directory whose real
    tokens are the target's tokens (same ids, same strings) and whose trained length holds
    the context window plus gamma masks."""
    from vllm_anyorder.model_executor.masked_diffusion import MaskedDiffusionFormatError, read_spec

    try:
        spec = read_spec(cfg.drafter)
    except MaskedDiffusionFormatError as err:
        raise AnyOrderConfigError(f"specdiff drafter {cfg.drafter!r}: {err}") from None
    room = spec.max_length - cfg.num_draft_tokens
    if room < 1:
        raise AnyOrderConfigError(
            f"num_speculative_tokens={cfg.num_draft_tokens} leaves no room for context in the "
            f"drafter's trained length {spec.max_length}; use fewer draft tokens"
        )
    if cfg.context_window > room:
        raise AnyOrderConfigError(
            f"specdiff.context_window={cfg.context_window} + {cfg.num_draft_tokens} draft tokens "
            f"exceeds the drafter's trained length {spec.max_length} (at most {room})"
        )
    hf = getattr(target_model_config, "hf_config", None)
    target_vocab = getattr(hf, "vocab_size", None) or getattr(
        getattr(hf, "text_config", None), "vocab_size", None)
    if target_vocab is not None and spec.num_tokens > int(target_vocab):
        raise AnyOrderConfigError(
            f"specdiff drafter has {spec.num_tokens} tokens (+ mask id {spec.mask_token_id}) "
            f"but the target's vocabulary has {target_vocab}: drafts would not be target tokens"
        )
    target_tok = _tokenizer_vocab(getattr(target_model_config, "tokenizer", None))
    if target_tok is not None and spec.num_tokens < len(target_tok):
        raise AnyOrderConfigError(
            f"specdiff drafter has {spec.num_tokens} tokens but the target's tokenizer has "
            f"{len(target_tok)}: the drafter cannot read every context"
        )
    drafter_tok = _tokenizer_vocab(cfg.drafter)
    if target_tok is not None and drafter_tok is not None and drafter_tok != target_tok:
        diff = sorted(set(drafter_tok.items()) ^ set(target_tok.items()))[:5]
        raise AnyOrderConfigError(
            f"specdiff drafter's tokenizer differs from the target's (e.g. {diff}); "
            "the drafter must use the target's tokenizer"
        )


def _tokenizer_vocab(path: Any) -> dict[str, int] | None:
    """token string -> id from a local ``tokenizer.json`` (None when there is none)."""
    if not isinstance(path, str) or not (Path(path) / "tokenizer.json").is_file():
        return None
    try:
        data = json.loads((Path(path) / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise AnyOrderConfigError(f"cannot read {path}/tokenizer.json: {err}") from None
    vocab = dict((data.get("model") or {}).get("vocab") or {})
    for tok in data.get("added_tokens") or []:
        vocab[tok["content"]] = tok["id"]
    return vocab


def check_assd_target(cfg: AssdConfig, target_model_config: Any) -> None:
    """``method="assd"``: the target must be an AS-ARM, because ASSD drafts with the model's
    query stream (or verifies n-gram drafts in its permuted-causal forward)."""
    hf = getattr(target_model_config, "hf_config", None)
    if not families.is_asarm(hf):
        raise AnyOrderConfigError(
            f"method 'assd' needs an any-subset autoregressive (AS-ARM) target: it drafts "
            f"with the model's query stream. {getattr(target_model_config, 'model', '?')!r} "
            f"has architectures {getattr(hf, 'architectures', None)} (model_type "
            f"{getattr(hf, 'model_type', None)!r}); expected one of "
            f"{list(families.architectures('asarm'))}")
    if cfg.drafter_kind.queries_target and cfg.k == 2:
        logger.warning(
            "vllm_anyorder: assd with k=2: Guo & Ermon advise k > 2 (a round of two "
            "forwards commits 2 tokens for sure; here up to 3 with vLLM's bonus token)")
