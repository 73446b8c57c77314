"""Low-rank adapters (LoRA) for fine-tuning a committed model into a small committed file.

Why: the project commits one larger target (``models/ar-target-large``, 45 MB) and nothing
else that size. Its Jacobi-distilled twin (``train_jacobi --lora-rank``) is stored as an
adapter of a few MB and *built* on each machine by merging it into the base weights
(``scripts/setup.sh`` runs ``python -m training.lora build DIR``); the built model is an
ordinary HF Llama directory that vLLM serves like any other.

Rule (Hu et al. 2021, Eq. 3): ``W' = W + (alpha / r) * B @ A`` with ``A`` [r, in] and
``B`` [out, r]; ``B`` starts at zero, so training starts from the base model exactly. Only
A and B train (the base weights, embeddings and norms stay frozen).

Merging is one function for the trainer and the build: A and B are rounded to the stored
dtype (bf16) first, the product is taken in float64 and the sum rounded once to bf16, so
the weights the trainer evaluates, the ones it saves and the ones a build writes are the
same numbers (float64 makes the rounding independent of the CPU's matmul kernels).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_FILE, CONFIG_FILE = "adapter.safetensors", "adapter_config.json"
STORED = torch.bfloat16
CARRIED = ("MODEL_CARD.md", "training_log.json", "jacobi_eval.json")  # adapter dir <-> build
STAMP = "built_from_adapter.sha1"  # in a built model: the adapter file it was merged from


def adapter_sha1(adapter_dir: Path) -> str:
    import hashlib

    return hashlib.sha1((adapter_dir / ADAPTER_FILE).read_bytes()
                        + (adapter_dir / CONFIG_FILE).read_bytes()).hexdigest()


class LoRALinear(nn.Module):
    """``base(x) + scale * x @ A.T @ B.T`` (x [..., in] -> [..., out]); base frozen."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, g: torch.Generator):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.scale = alpha / rank
        bound = 1.0 / math.sqrt(base.in_features)  # nn.Linear's init range, as LoRA's A
        self.lora_A = nn.Parameter((torch.rand(rank, base.in_features, generator=g) * 2 - 1)
                                   * bound)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_A.T.to(x.dtype)) @ self.lora_B.T.to(x.dtype) \
            * self.scale


def _targets(model) -> list[tuple[nn.Module, str, str]]:
    """(parent module, attribute, dotted name) of every adapted linear layer."""
    out = []
    for name, module in model.named_modules():
        for attr in TARGETS:
            child = getattr(module, attr, None)
            if isinstance(child, (nn.Linear, LoRALinear)):
                out.append((module, attr, f"{name}.{attr}"))
    return out


def attach(model, rank: int, alpha: float, seed: int) -> int:
    """Freeze ``model`` and wrap its projections in adapters; returns the trainable count."""
    model.requires_grad_(False)
    g = torch.Generator().manual_seed(seed)
    for parent, attr, _ in _targets(model):
        setattr(parent, attr, LoRALinear(getattr(parent, attr), rank, alpha, g))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def adapter_tensors(model) -> dict[str, torch.Tensor]:
    """{"<layer>.lora_A" / ".lora_B": tensor in the stored dtype} of an attached model."""
    out = {}
    for parent, attr, name in _targets(model):
        layer = getattr(parent, attr)
        out[f"{name}.lora_A"] = layer.lora_A.detach().to(STORED).contiguous()
        out[f"{name}.lora_B"] = layer.lora_B.detach().to(STORED).contiguous()
    return out


def merged_weight(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float):
    """bf16(W + scale * B @ A) with A, B as stored (bf16) and the sum in float64."""
    delta = b.to(STORED).double() @ a.to(STORED).double()
    return (w.double() + scale * delta).to(STORED)


def merge(model, adapters: dict[str, torch.Tensor] | None = None, scale: float | None = None):
    """Replace every adapter (attached, or given as ``adapters`` with ``scale`` for a plain
    model) by a Linear holding the merged bf16 weight (kept in the model's dtype)."""
    for parent, attr, name in _targets(model):
        layer = getattr(parent, attr)
        if isinstance(layer, LoRALinear):
            base, a, b, s = layer.base, layer.lora_A, layer.lora_B, layer.scale
        else:
            base, a, b, s = layer, adapters[f"{name}.lora_A"], adapters[f"{name}.lora_B"], scale
        with torch.no_grad():
            base.weight.copy_(merged_weight(base.weight, a, b, s).to(base.weight.dtype))
        setattr(parent, attr, base)
    return model


def save_adapter(model, out: Path, config: dict) -> None:
    """``out``/adapter.safetensors + adapter_config.json (``base``, ``rank``, ``alpha``,
    ``built``: where ``build`` writes the merged model, repository-relative)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(adapter_tensors(model), str(out / ADAPTER_FILE))
    os.chmod(out / ADAPTER_FILE, 0o644)
    (out / CONFIG_FILE).write_text(json.dumps({**config, "targets": list(TARGETS)}, indent=1)
                                   + "\n")


def build(adapter_dir: Path, out: Path | None = None, *, quiet: bool = False) -> Path:
    """Write the merged model of ``adapter_dir`` (default: its config's ``built`` path):
    base weights + adapter, saved in bf16 like the trainers' models, with the base's
    config / tokenizer / generation config and the adapter dir's card and logs."""
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    from training.data import REPO_ROOT
    from training.loop import save_files

    cfg = json.loads((adapter_dir / CONFIG_FILE).read_text())
    base = REPO_ROOT / cfg["base"]
    out = out or REPO_ROOT / cfg["built"]
    model = LlamaForCausalLM.from_pretrained(str(base), dtype=STORED)
    merge(model, load_file(str(adapter_dir / ADAPTER_FILE)), cfg["alpha"] / cfg["rank"])
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    save_files(out, base, bf16_config={"indent": 2, "sort_keys": True})
    shutil.copy(base / "generation_config.json", out / "generation_config.json")
    for name in CARRIED:
        if (adapter_dir / name).exists():
            shutil.copy(adapter_dir / name, out / name)
    (out / STAMP).write_text(adapter_sha1(adapter_dir) + "\n")
    if not quiet:
        print(f"built {out} from {cfg['base']} + {adapter_dir}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("build",))
    ap.add_argument("adapter_dir", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--if-stale", action="store_true",
                    help="do nothing when the built model was merged from this adapter")
    args = ap.parse_args(argv)
    if args.if_stale:
        from training.data import REPO_ROOT

        cfg = json.loads((args.adapter_dir / CONFIG_FILE).read_text())
        stamp = (args.out or REPO_ROOT / cfg["built"]) / STAMP
        if stamp.exists() and stamp.read_text().strip() == adapter_sha1(args.adapter_dir):
            return 0
    build(args.adapter_dir, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
