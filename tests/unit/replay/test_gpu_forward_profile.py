"""benchmarks/gpu_forward_profile.py: its attention (query heads of a KV head stacked as rows)
is ordinary GQA with the AR / dLLM masks, and ``--tiny`` runs on a CPU in seconds and writes a
profile the loader reads."""

import importlib.util
import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from benchmarks import cost_profiles as cp
from benchmarks.target_shapes import TINY_AR, TINY_DLLM

SCRIPT = cp.PROFILES.parent / "gpu_forward_profile.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_forward_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("shape", [TINY_AR, TINY_DLLM], ids=lambda s: s.name)
def test_layer_is_plain_gqa_with_the_masks(shape):
    torch.manual_seed(0)
    stack = _module().Stack(shape, 1, 2, 64, "cpu", torch.float32)
    kc, vc = stack.cache[0]
    kc.normal_()
    vc.normal_()
    b, q, ctx, hd, g = 2, 8, 5, shape.head_dim, shape.heads // shape.kv_heads
    x = torch.randn(b, q, shape.hidden)
    out = stack.layers_forward(x, ctx, stack.mask(q, ctx))
    p = stack.layers[0]  # the reference: query head h reads KV head h // g
    h = F.rms_norm(x, (shape.hidden,), p["n1"])
    qh = F.linear(h, p["q"]).view(b, q, shape.heads, hd).transpose(1, 2)
    keys = kc[:b, :, :ctx + q].repeat_interleave(g, 1)
    values = vc[:b, :, :ctx + q].repeat_interleave(g, 1)
    rows = torch.arange(q)[:, None]
    cols = torch.arange(ctx + q)[None, :] - ctx
    mask = (cols < 0) | (cols // shape.block == rows // shape.block) if shape.kind == "dllm" \
        else cols <= rows
    att = F.scaled_dot_product_attention(qh, keys, values, attn_mask=mask)
    y = x + F.linear(att.transpose(1, 2).reshape(b, q, -1), p["o"])
    h = F.rms_norm(y, (shape.hidden,), p["n2"])
    y = y + F.linear(F.silu(F.linear(h, p["gate"])) * F.linear(h, p["up"]), p["down"])
    torch.testing.assert_close(out, y, rtol=1e-4, atol=1e-5)


def test_gpu_forward_profile_tiny_on_cpu(tmp_path):
    out = tmp_path / "tiny.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--device", "cpu", "--out",
                           str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["kind"] == "gpu-measured" and data["label"].startswith("MEASURED")
    prof = cp.load_profile(out)
    assert set(prof.targets) == {"tiny-ar", "tiny-dllm"}
    for name, cost in prof.targets.items():
        points = data["targets"][name]["points"]
        assert points and all(p["seconds"] > 0 for p in points)
        assert {p["batch"] for p in points} == {1, 2}
        # an interpolated query lands inside the measured range, plus the overhead
        t = cost.seconds(6, 2, 16)
        lo = min(p["seconds"] for p in points) + cost.overhead_s
        assert lo <= t < 10 * max(p["seconds"] for p in points) + cost.overhead_s
