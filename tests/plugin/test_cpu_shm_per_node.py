"""Patch ``cpu_shm_per_node``: CPU ranks agree on a shared-memory group name only when they
see the same ``/dev/shm`` (the end-to-end case, two nodes, is tests/e2e/test_ray_multinode.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest

from vllm_anyorder.patches import ray_cpu

DOMAIN = "from vllm_anyorder.patches.ray_cpu import _shm_domain; print(_shm_domain())"


def test_the_domain_is_shared_by_processes_that_share_dev_shm():
    here = ray_cpu._shm_domain()
    child = subprocess.run([sys.executable, "-c", DOMAIN], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert here and child == here


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare (a private /dev/shm)")
def test_a_private_dev_shm_is_another_domain():
    inner = f"mount -t tmpfs tmpfs /dev/shm && exec {sys.executable} -c '{DOMAIN}'"
    child = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", inner],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert child and child != ray_cpu._shm_domain()


def test_group_name_carries_the_domain(monkeypatch):
    from vllm_anyorder import _compat

    shm = _compat.cpu_shm_distributed_cls()
    monkeypatch.setattr(shm, "make_group_name", shm.__dict__["make_group_name"])  # restored
    monkeypatch.setenv("VLLM_DIST_IDENT", "40338")
    comm = SimpleNamespace(unique_name="tp:0", ranks=[0, 1])
    stock = shm.make_group_name(comm)
    ray_cpu.apply_cpu_shm_per_node()
    assert shm.make_group_name(comm) == f"{stock}-{ray_cpu._shm_domain()}"
