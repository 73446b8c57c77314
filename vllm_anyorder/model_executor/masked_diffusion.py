"""Absorbing-state (masked) discrete-diffusion drafters in the released MDLM and SEDD formats.

Reads, runs and writes the two public checkpoint layouts of masked diffusion LMs (facts from
``shared/notes/released-formats.md`` sections 2-3); the network itself is :mod:`.dit`.

* MDLM (Sahoo et al. 2024, ``kuleshov-group/mdlm-owt``): flat ``config.json`` with
  ``model_type "mdlm"`` (``hidden_dim``, ``cond_dim``, ``n_blocks``, ``n_heads``,
  ``model_length``, ``vocab_size``, ``time_conditioning``); one ``model.safetensors`` whose
  tensor names all carry the ``backbone.`` prefix. Output: logits. With
  ``time_conditioning: false`` the model zeroes sigma, so the conditioning is constant.
* SEDD absorb (Lou et al. 2024, ``louaaron/sedd-small``/``-medium``): the nested hydra run
  config (``tokens``, ``graph.type == "absorb"``, ``noise``, ``model.{hidden_size, ...}``);
  ``pytorch_model.bin`` (a ``torch.save``d OrderedDict) or ``model.safetensors``, names without
  prefix. Output: a log concrete score; with ``scale_by_sigma`` it is shifted by
  ``-log(expm1(sigma)) - log(V-1)``, and the entry of each position's own input token is set
  to 0 (scatter).

Both: mask id = vocab rows - 1 (MDLM: ``vocab_size - 1``; SEDD: ``tokens``). Noise is
loglinear, total noise ``sigma(t) = -log1p(-(1 - 1e-3) t)`` (MDLM and SEDD ``loglinear``).
For an absorbing process the SEDD score at a masked position is p0(y | x_t) / expm1(sigma),
so the softmax of either output over the real tokens is the denoising distribution.

Pure torch (safetensors for the files). Importing this module and :func:`read_spec` need only
``json``: the model class (:class:`.dit.MaskedDiffusionLM`, re-exported here) and torch load
on first use.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

MDLM_WEIGHTS = "model.safetensors"
SEDD_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
DTYPES = ("float32", "bfloat16", "float16")


class MaskedDiffusionFormatError(ValueError):
    """A drafter directory that is not a readable MDLM / SEDD-absorb checkpoint."""


@dataclass(frozen=True)
class MaskedDiffusionSpec:
    family: str  # "mdlm" | "sedd"
    vocab_size: int  # embedding rows, mask row included
    mask_token_id: int  # vocab_size - 1 in both families
    hidden_size: int
    cond_dim: int
    n_blocks: int
    n_heads: int
    max_length: int  # mdlm: model_length; sedd: model.length
    time_conditioning: bool  # mdlm: config flag; sedd: always True
    scale_by_sigma: bool  # sedd: model.scale_by_sigma; False for mdlm
    torch_dtype: str = "float32"
    weights_file: str = MDLM_WEIGHTS

    @property
    def num_tokens(self) -> int:
        """Real tokens (the mask row excluded)."""
        return self.vocab_size - 1


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MaskedDiffusionFormatError(f"config.json: {name} must be a positive integer, got {value!r}")
    return value


def _make_spec(**kw) -> MaskedDiffusionSpec:
    for key in ("vocab_size", "hidden_size", "cond_dim", "n_blocks", "n_heads", "max_length"):
        _positive(key, kw[key])
    if kw["vocab_size"] < 2:
        raise MaskedDiffusionFormatError("config.json: the vocabulary needs a mask row and a token")
    head_dim, rest = divmod(kw["hidden_size"], kw["n_heads"])
    if rest or head_dim % 2:
        raise MaskedDiffusionFormatError(
            f"hidden size {kw['hidden_size']} / {kw['n_heads']} heads is not an even head_dim")
    if kw["torch_dtype"] not in DTYPES:
        raise MaskedDiffusionFormatError(f"config.json: torch_dtype {kw['torch_dtype']!r} is not one of {DTYPES}")
    return MaskedDiffusionSpec(mask_token_id=kw["vocab_size"] - 1, **kw)


def mdlm_spec(vocab_size, hidden_size, cond_dim, n_blocks, n_heads, max_length,
              time_conditioning=False, torch_dtype="float32") -> MaskedDiffusionSpec:
    return _make_spec(family="mdlm", vocab_size=vocab_size, hidden_size=hidden_size,
                      cond_dim=cond_dim, n_blocks=n_blocks, n_heads=n_heads, max_length=max_length,
                      time_conditioning=bool(time_conditioning), scale_by_sigma=False,
                      torch_dtype=torch_dtype, weights_file=MDLM_WEIGHTS)


def sedd_spec(tokens, hidden_size, cond_dim, n_blocks, n_heads, max_length,
              scale_by_sigma=True, torch_dtype="float32") -> MaskedDiffusionSpec:
    """``tokens`` real tokens; the absorbing graph adds the mask row (vocab = tokens + 1)."""
    return _make_spec(family="sedd", vocab_size=_positive("tokens", tokens) + 1,
                      hidden_size=hidden_size, cond_dim=cond_dim, n_blocks=n_blocks,
                      n_heads=n_heads, max_length=max_length, time_conditioning=True,
                      scale_by_sigma=bool(scale_by_sigma), torch_dtype=torch_dtype,
                      weights_file=SEDD_WEIGHTS[1])


def _get(cfg: dict, key: str, where: str = ""):
    if not isinstance(cfg, dict) or key not in cfg:
        raise MaskedDiffusionFormatError(f"config.json: missing key {where + key!r}")
    return cfg[key]


def read_spec(path) -> MaskedDiffusionSpec:
    """Parse a drafter directory's ``config.json`` (json only) and find its weights file."""
    root = Path(path)
    if not root.is_dir():
        raise MaskedDiffusionFormatError(f"drafter path {str(path)!r} is not a directory")
    cfg_path = root / "config.json"
    if not cfg_path.is_file():
        raise MaskedDiffusionFormatError(f"no config.json in drafter directory {str(path)!r}")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise MaskedDiffusionFormatError(f"config.json is not valid JSON: {err}") from None
    if not isinstance(cfg, dict):
        raise MaskedDiffusionFormatError("config.json is not a JSON object")
    dtype = cfg.get("torch_dtype") or "float32"
    if cfg.get("model_type") == "mdlm":
        spec = mdlm_spec(
            _get(cfg, "vocab_size"), _get(cfg, "hidden_dim"), _get(cfg, "cond_dim"),
            _get(cfg, "n_blocks"), _get(cfg, "n_heads"), _get(cfg, "model_length"),
            time_conditioning=cfg.get("time_conditioning", False), torch_dtype=dtype)
        weights = (MDLM_WEIGHTS,)
    elif all(k in cfg for k in ("tokens", "graph", "model")):
        graph = _get(cfg, "graph")
        gtype = _get(graph, "type", "graph.")
        if gtype != "absorb":
            raise MaskedDiffusionFormatError(
                f"SEDD graph type {gtype!r} is not a masked model: only graph.type 'absorb' "
                "(absorbing state, mask id = tokens) can draft")
        noise = cfg.get("noise", {"type": "loglinear"})
        if not isinstance(noise, dict) or noise.get("type", "loglinear") != "loglinear":
            raise MaskedDiffusionFormatError(
                f"SEDD noise {noise!r} is not supported: only noise.type 'loglinear'")
        m = _get(cfg, "model")
        spec = sedd_spec(
            _get(cfg, "tokens"), _get(m, "hidden_size", "model."), _get(m, "cond_dim", "model."),
            _get(m, "n_blocks", "model."), _get(m, "n_heads", "model."), _get(m, "length", "model."),
            scale_by_sigma=_get(m, "scale_by_sigma", "model."), torch_dtype=dtype)
        weights = SEDD_WEIGHTS
    else:
        raise MaskedDiffusionFormatError(
            "config.json is neither an MDLM config (model_type 'mdlm') nor a SEDD hydra config "
            f"(keys tokens/graph/model); got model_type {cfg.get('model_type')!r}")
    found = next((w for w in weights if (root / w).is_file()), None)
    if found is None:
        raise MaskedDiffusionFormatError(
            f"no weights file in {str(path)!r}: expected {' or '.join(weights)}")
    return MaskedDiffusionSpec(**{**spec.__dict__, "weights_file": found})


# ---------------------------------------------------------------------------- torch side
def __getattr__(name):  # the model lives in .dit; importing it lazily keeps read_spec torch-free
    if name in ("MaskedDiffusionLM", "loglinear_sigma"):
        from vllm_anyorder.model_executor import dit
        return getattr(dit, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _torch_dtype(name):
    import torch

    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise MaskedDiffusionFormatError(f"dtype {name!r} is not one of {DTYPES}")
    return getattr(torch, name)


def random_drafter(spec: MaskedDiffusionSpec, seed: int = 0, init_std: float = 0.02) -> MaskedDiffusionLM:
    """Randomly initialised drafter (normal(0, init_std) weights, zero biases, unit norms;
    modulation weights random too, so every block contributes), in ``spec.torch_dtype``, eval."""
    import torch

    from vllm_anyorder.model_executor.dit import MaskedDiffusionLM

    gen = torch.Generator().manual_seed(seed)
    model = MaskedDiffusionLM(spec)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or "norm_final" in name:
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * init_std)
    return model.to(_torch_dtype(spec.torch_dtype)).eval()


def _prefix(spec: MaskedDiffusionSpec) -> str:
    return "backbone." if spec.family == "mdlm" else ""


def _read_weights(path: Path, spec: MaskedDiffusionSpec) -> dict:
    file = path / spec.weights_file
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file
            return load_file(str(file))
        import torch
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001  (corrupt / truncated / not a state dict)
        raise MaskedDiffusionFormatError(f"cannot read weights {str(file)!r}: {err}") from None


def load_drafter(path, dtype: str | None = None, device="cpu") -> MaskedDiffusionLM:
    """Load a drafter directory strictly (every tensor present, none extra, shapes equal)."""
    import torch

    from vllm_anyorder.model_executor.dit import MaskedDiffusionLM

    spec = read_spec(path)
    state = _read_weights(Path(path), spec)
    if not isinstance(state, dict):
        raise MaskedDiffusionFormatError(f"{spec.weights_file} does not hold a state dict")
    prefix = _prefix(spec)
    with torch.device("meta"):
        model = MaskedDiffusionLM(spec)
    expected = {prefix + k[4:]: v for k, v in model.state_dict().items()}  # k[4:]: drop "dit."
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(f"{k} {tuple(state[k].shape)} (expected {tuple(v.shape)})"
                   for k, v in expected.items() if k in state and state[k].shape != v.shape)
    if missing or unexpected or wrong:
        parts = [f"{label}: {', '.join(names[:12])}{' ...' if len(names) > 12 else ''}"
                 for label, names in (("missing", missing), ("unexpected", unexpected),
                                      ("wrong shape", wrong)) if names]
        bare = {k[len("backbone."):] if k.startswith("backbone.") else "backbone." + k for k in state}
        if missing and set(missing) <= bare:  # the other family's naming
            parts.insert(0, "the names should " + ("carry the 'backbone.' prefix of MDLM files"
                                                   if prefix else "have no prefix in SEDD files"))
        raise MaskedDiffusionFormatError(
            f"weights in {spec.weights_file} do not match the {spec.family} config "
            f"({len(missing)} missing, {len(unexpected)} unexpected, {len(wrong)} wrong shape); "
            + "; ".join(parts))
    inner = {"dit." + k[len(prefix):]: v for k, v in state.items()}
    model.load_state_dict(inner, strict=True, assign=True)
    target = _torch_dtype(dtype or spec.torch_dtype)
    model = model.to(device=device, dtype=target)
    return model.eval()


def _mdlm_config(spec: MaskedDiffusionSpec) -> dict:
    """The released ``kuleshov-group/mdlm-owt`` config keys, with this model's values."""
    return {
        "_name_or_path": "mdlm-drafter", "architectures": ["MDLM"],
        "auto_map": {"AutoConfig": "configuration_mdlm.MDLMConfig",
                     "AutoModelForMaskedLM": "modeling_mdlm.MDLM"},
        "cond_dim": spec.cond_dim, "dropout": 0.1, "hidden_dim": spec.hidden_size,
        "model_length": spec.max_length, "model_type": "mdlm", "n_blocks": spec.n_blocks,
        "n_heads": spec.n_heads, "return_dict": False,
        "time_conditioning": spec.time_conditioning, "torch_dtype": spec.torch_dtype,
        "transformers_version": "4.38.2", "vocab_size": spec.vocab_size,
    }


def _sedd_config(spec: MaskedDiffusionSpec) -> dict:
    """The released sedd-medium hydra config layout (training keys as released), this model's
    sizes; ``torch_dtype`` is added only for non-fp32 weights (upstream never writes it)."""
    cfg = {
        "ngpus": 1, "tokens": spec.num_tokens,
        "training": {"batch_size": 512, "accum": 1, "n_iters": 1300001, "snapshot_freq": 50000,
                     "log_freq": 50, "eval_freq": 100, "snapshot_freq_for_preemption": 10000,
                     "weight": "standard", "snapshot_sampling": True, "ema": 0.9999},
        "data": {"train": "openwebtext", "valid": "wikitext103", "cache_dir": "data"},
        "graph": {"type": "absorb"},
        "noise": {"type": "loglinear", "sigma_min": 0.0001, "sigma_max": 20},
        "sampling": {"predictor": "euler", "steps": 128, "noise_removal": True},
        "eval": {"batch_size": 512, "perplexity": True, "perplexity_batch_size": 32},
        "optim": {"weight_decay": 0, "optimizer": "AdamW", "lr": 0.0003, "beta1": 0.9,
                  "beta2": 0.999, "eps": 1e-08, "warmup": 2500, "grad_clip": 1.0},
        "model": {"name": "drafter", "type": "ddit", "hidden_size": spec.hidden_size,
                  "cond_dim": spec.cond_dim, "length": spec.max_length,
                  "n_blocks": spec.n_blocks, "n_heads": spec.n_heads,
                  "scale_by_sigma": spec.scale_by_sigma, "dropout": 0.1},
        "work_dir": "absorb_drafter",
    }
    if spec.torch_dtype != "float32":
        cfg["torch_dtype"] = spec.torch_dtype
    return cfg


def save_drafter(model: MaskedDiffusionLM, path, *, sedd_weights: str = "safetensors") -> None:
    """Write ``model`` in its family's released layout: config.json + weights, nothing else.

    MDLM: ``model.safetensors`` with ``backbone.`` names; SEDD: names without prefix in
    ``model.safetensors`` or (``sedd_weights="bin"``) a ``torch.save``d OrderedDict in
    ``pytorch_model.bin``. Tensors are written in registration order, in the model's dtype
    (``rotary_emb.inv_freq`` always fp32); config ``torch_dtype`` is that dtype."""
    import torch

    if sedd_weights not in ("safetensors", "bin"):
        raise ValueError(f"sedd_weights must be 'safetensors' or 'bin', got {sedd_weights!r}")
    name = str(next(model.parameters()).dtype).removeprefix("torch.")
    spec = MaskedDiffusionSpec(**{**model.spec.__dict__, "torch_dtype": name})
    prefix = _prefix(spec)
    state = OrderedDict((prefix + k[4:], v.detach().cpu().contiguous())
                        for k, v in model.state_dict().items())
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    config = _mdlm_config(spec) if spec.family == "mdlm" else _sedd_config(spec)
    indent = 2 if spec.family == "mdlm" else 1  # as the released files are spaced
    (out / "config.json").write_text(json.dumps(config, indent=indent) + "\n")
    weights = "pytorch_model.bin" if spec.family == "sedd" and sedd_weights == "bin" else MDLM_WEIGHTS
    for stale in {MDLM_WEIGHTS, "pytorch_model.bin"} - {weights}:  # read_spec would prefer it
        (out / stale).unlink(missing_ok=True)
    if weights == "pytorch_model.bin":
        torch.save(state, out / weights)
    else:
        from safetensors.torch import save_file
        save_file(dict(state), str(out / weights), metadata={"format": "pt"})
    os.chmod(out / weights, 0o644)  # save_file leaves 0600
