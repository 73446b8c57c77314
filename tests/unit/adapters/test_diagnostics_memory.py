"""``diagnostics.memory_of``: live tensor bytes and the C heap, the numbers the load test
uses to tell a leak (tensors or in-use heap grow) from allocator caching (free heap grows)."""

import torch

from vllm_anyorder.diagnostics import memory_of


def test_a_kept_tensor_shows_up_and_goes_away():
    before = memory_of()
    kept = torch.ones(16, 2 ** 20 // 4)  # 16 MB, stays referenced
    during = memory_of()
    assert during["tensor_mb"] - before["tensor_mb"] >= 15.9
    assert during["tensors"] >= before["tensors"] + 1
    if "heap_in_use_mb" in before:  # glibc >= 2.33: the 16 MB are in use (mmapped here)
        assert during["heap_in_use_mb"] - before["heap_in_use_mb"] >= 15.9
    del kept
    after = memory_of()
    assert after["tensor_mb"] - before["tensor_mb"] < 1.0
