"""Patch ``cpu_expand_kernel``: vLLM 0.32's CPU fallback of the rejection sampler's
``expand_kernel`` must write into its output for every dtype.

Upstream bug: ``cpu_triton_utils._expand_kernel_impl`` passes ``_ensure_int64(output)`` to
the C++ kernel, which is a *copy* for any non-int64 tensor, so per-token temperature /
top-p (float32) and top-k (int32) come back uninitialised. The first test proves the stock
function is still broken (in a fresh interpreter with plugins off, so the patch cannot have
run); when it starts failing, upstream fixed the bug and the patch should go.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
cpu_triton_utils = pytest.importorskip("vllm.utils.cpu_triton_utils")

STOCK_CHECK = textwrap.dedent("""
    import json, sys
    import torch
    import vllm.utils.cpu_triton_utils as m
    # registers torch.ops._C.expand_kernel_impl: the library this CPU can run (vllm._C needs
    # AVX512_BF16 and dies with SIGILL elsewhere; _C_AVX512 / _C_AVX2 register the same ops)
    from vllm.platforms import current_platform
    current_platform.import_kernels()
    if not hasattr(torch.ops._C, "expand_kernel_impl"):
        print(json.dumps({"skip": "no CPU expand_kernel_impl op in this vLLM build"}))
        sys.exit(0)
    fn = m._expand_kernel_impl
    out = {"module": fn.__module__, "qualname": fn.__qualname__}
    for name, dtype, inp in (("float32", torch.float32, [0.7, 1.0]),
                             ("int32", torch.int32, [3, 4]),
                             ("int64", torch.int64, [3, 4])):
        o = torch.full((5,), -1, dtype=dtype)
        fn(o, torch.tensor(inp, dtype=dtype), torch.tensor([2, 5], dtype=torch.int32), -9, -9)
        out[name] = o.tolist()
    print(json.dumps(out))
""")


def test_stock_vllm_expand_kernel_ignores_float_outputs():
    env = {**os.environ, "VLLM_PLUGINS": "", "VLLM_ANYORDER_DISABLE_PATCHES": "cpu_expand_kernel"}
    proc = subprocess.run([sys.executable, "-c", STOCK_CHECK], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(result["skip"])
    assert result["module"] == "vllm.utils.cpu_triton_utils", result  # the stock function
    # the int64 path works, so the op itself ran ...
    assert result["int64"] == [3, 3, 4, 4, 4]
    # ... but a float32 output is left untouched (the C++ kernel wrote into a copy)
    assert result["float32"] == [-1.0] * 5, (
        "vLLM's stock _expand_kernel_impl now writes float outputs in place: upstream fixed "
        "the bug. Remove the cpu_expand_kernel patch (vllm_anyorder/patches/, "
        "docs/UPSTREAM.md) and this test.")
    assert result["int32"] == [-1] * 5  # same bug for top-k (int32)


@pytest.fixture(scope="module")
def expand():
    from vllm_anyorder import patches

    patches.apply("cpu_expand_kernel")
    assert "cpu_expand_kernel" in patches.applied()
    fn = cpu_triton_utils._expand_kernel_impl
    assert fn.__module__ == "vllm_anyorder.patches.cpu_kernels"
    return fn


def test_patched_kernel_writes_float_outputs_in_place(expand):
    out = torch.full((5,), -1.0, dtype=torch.float32)
    expand(out, torch.tensor([0.7, 1.0]), torch.tensor([2, 5], dtype=torch.int32), 0, 0)
    assert out.dtype == torch.float32
    assert torch.allclose(out, torch.tensor([0.7, 0.7, 1.0, 1.0, 1.0]))


def test_patched_kernel_replaces_replace_from_with_replace_to(expand):
    # vLLM uses it to map temperature 0 (greedy) to 1 before dividing logits by it
    out = torch.full((6,), -1.0)
    expand(out, torch.tensor([0.0, 0.5, 0.0]), torch.tensor([1, 3, 6]), 0, 1)
    assert out.tolist() == [1.0, 0.5, 0.5, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_patched_kernel_handles_integer_outputs(expand, dtype):
    out = torch.full((5,), -1, dtype=dtype)
    expand(out, torch.tensor([7, 3], dtype=dtype), torch.tensor([2, 5], dtype=torch.int32), 3, 0)
    assert out.dtype == dtype and out.tolist() == [7, 7, 0, 0, 0]


def test_patched_kernel_handles_empty_requests_and_leaves_the_tail_alone(expand):
    # a request with no tokens (cu repeats) and an output buffer longer than the tokens
    out = torch.full((6,), -1.0)
    expand(out, torch.tensor([0.1, 0.2, 0.3]), torch.tensor([2, 2, 4]), -5, 0,
           MAX_NUM_TOKENS=128)
    assert torch.allclose(out, torch.tensor([0.1, 0.1, 0.3, 0.3, -1.0, -1.0]))

