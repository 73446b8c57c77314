"""Patch ``cpu_shm_stale_segments``: the all-reduce segments earlier engines left are removed
before a CPU TP group makes its own; a live engine's and a new one stay."""

from __future__ import annotations

import mmap
import os
import time

import pytest

from vllm_anyorder import _compat
from vllm_anyorder.patches import cpu_shm_segments as segs

GROUP = "40338-tp:0-[0-1]-cpushm"


def _segment(directory, name: str):
    path = directory / name
    path.write_bytes(b"\0" * 4096)
    return path


def test_left_over_segments_are_removed_and_others_stay(tmp_path):
    stale = [_segment(tmp_path, f"{GROUP}_{r}") for r in (0, 1)]
    stale.append(_segment(tmp_path, "vllm_dist_d4fb-tp:0-[0-1]-cpushm-b38a0b0b_1"))
    kmp = _segment(tmp_path, "__KMP_REGISTERED_LIB_3248_0")  # not vLLM's all-reduce
    not_a_rank = _segment(tmp_path, f"{GROUP}_x")
    removed = segs.remove_stale(tmp_path, started=time.time() + 60)
    assert sorted(removed) == sorted(p.name for p in stale)
    assert not any(p.exists() for p in stale)
    assert kmp.exists() and not_a_rank.exists()


def test_a_segment_made_after_the_process_started_stays(tmp_path):
    """A rank of the group being made now creates its segment after every rank started."""
    seg = _segment(tmp_path, f"{GROUP}_1")
    assert segs.remove_stale(tmp_path, started=time.time() - 60) == []
    assert seg.exists()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_a_segment_a_live_process_maps_stays():
    path = segs.SHM_DIR / f"{GROUP}-test{os.getpid()}_0"
    path.write_bytes(b"\0" * 4096)
    try:
        with open(path, "r+b") as fh, mmap.mmap(fh.fileno(), 4096):
            assert path.name in segs.mapped_names()
            assert path.name not in segs.remove_stale(started=time.time() + 60)
            assert path.exists()
        assert path.name in segs.remove_stale(started=time.time() + 60)
    finally:
        path.unlink(missing_ok=True)


def test_this_process_started_before_now():
    assert 0 <= time.time() - segs.process_start() < 24 * 3600 * 365


def test_the_wrapper_clears_before_vllm_makes_its_segments(monkeypatch, tmp_path):
    shm = _compat.cpu_shm_distributed_cls()
    monkeypatch.setattr(shm, "_init_cpu_shm", lambda self: ("made", self.group_name))
    seen = []
    monkeypatch.setattr(segs, "remove_stale", lambda: seen.append(GROUP) or [])
    segs.apply_cpu_shm_stale_segments()
    comm = shm.__new__(shm)
    comm.group_name = GROUP
    assert shm._init_cpu_shm(comm) == ("made", GROUP) and seen == [GROUP]


def test_the_plugin_platform_installs_it_when_a_group_asks_for_its_communicator():
    from vllm_anyorder import patches
    from vllm_anyorder.cpu_platform import AnyorderCpuPlatform

    stock = "vllm.distributed.device_communicators.cpu_communicator.CpuCommunicator"
    assert AnyorderCpuPlatform.get_device_communicator_cls() == stock
    assert "cpu_shm_stale_segments" in patches.applied()
