"""Patches that let vLLM's Ray executor place CPU workers (the plugin's CPU platform only)
and run their tensor-parallel groups across nodes."""

from __future__ import annotations

import functools
import os

from vllm_anyorder import _compat

def apply_ray_cpu(on_cpu_platform) -> None:
    """Let vLLM's Ray executor place CPU workers (with the plugin's CPU platform).

    Why: stock vLLM 0.32 has no Ray support on CPU. ``AnyorderCpuPlatform`` (the
    ``vllm.platform_plugins`` entry point, chosen only where vLLM picks its stock CPU
    platform) sets ``ray_device_key = "CPU"``, so placement-group bundles are ``{"CPU": 1}``.
    Two spots of the Ray path still assume an accelerator: the actor options put the key into
    ``resources=`` (Ray refuses ``"CPU"`` there) and each actor looks its devices up in Ray's
    accelerator-id dict, which has no ``"CPU"`` entry (KeyError).
    What: (1) wraps ``RayExecutorV2._get_actor_resource_kwargs``: with our CPU platform it
    returns ``{"num_gpus": 0}`` (the actor is created with ``num_cpus=0`` inside its bundle,
    which holds the CPU, as a GPU actor sits in a GPU bundle); (2) wraps Ray's
    ``RuntimeContext.get_accelerator_ids`` to add ``"CPU": []`` (no device ids: CPU workers
    are ordered by rank, local ranks come from the node's bundle order). Installed lazily by
    ``AnyorderCpuPlatform.ray_device_key`` (read only by Ray code paths), so processes
    without Ray or on any other platform are untouched. The legacy ``RayDistributedExecutor``
    (``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``) is not supported (Ray refuses at start-up).
    Checked: vLLM 0.32.0 (``v1/executor/ray_executor_v2.py:144-156,276-282``,
    ``v1/executor/ray_utils.py:572-630``), 0.33.0 (``ray_executor_v2.py``: the same lines;
    ``ray_utils.py:323-370``, without the legacy executor's driver-node check), Ray 2.60.0
    (``runtime_context.py:577``).
    Remove: when vLLM's CPU platform supports Ray (sets ``ray_device_key`` itself).
    """
    executor = _compat.ray_executor_v2_cls()
    if executor is not None:
        original_kwargs = executor._get_actor_resource_kwargs

        def _get_actor_resource_kwargs():
            return {"num_gpus": 0} if on_cpu_platform() else original_kwargs()

        executor._get_actor_resource_kwargs = staticmethod(_get_actor_resource_kwargs)
    context = _compat.ray_runtime_context_cls()
    if context is not None:
        original_ids = context.get_accelerator_ids

        @functools.wraps(original_ids)
        def get_accelerator_ids(self):
            ids = original_ids(self)
            if on_cpu_platform():
                ids.setdefault("CPU", [])
            return ids

        context.get_accelerator_ids = get_accelerator_ids


def apply_cpu_shm_per_node() -> None:
    """Keep vLLM's shared-memory all-reduce to ranks that share one ``/dev/shm``.

    Why: on CPU, vLLM's TP/PP communicator uses its shared-memory all-reduce
    (``_CPUSHMDistributed``) whenever every rank of a group computes the same group name;
    the name is built from the rendezvous port, the group and its ranks only, so ranks on
    different nodes agree on it too, and each then opens the others' segments in its own
    ``/dev/shm``: start-up fails with "open shm in SHMManager failed. errno: 2" on every
    multi-node CPU deployment (seen: TP = 2 over Ray, one rank per node, two network
    namespaces with their own ``/dev/shm``; ``tests/e2e/test_ray_multinode.py``).
    What: wraps ``_CPUSHMDistributed.make_group_name`` to append a token naming the
    ``/dev/shm`` file system the rank sees (the kernel's boot id and the mount's device
    number). Ranks on one node (one ``/dev/shm``) still agree and keep the fast path; ranks
    on different nodes (or containers with separate ``/dev/shm``) disagree, and vLLM's own
    check (``CpuCommunicator._all_group_ranks_share_shm_group_name``) then falls back to
    ``torch.distributed`` (gloo over TCP) for that group. The same token on every rank of a
    group keeps the shared-memory segment names consistent. Applied with ``ray_cpu``.
    Checked: vLLM 0.32.0 (``distributed/device_communicators/cpu_communicator.py:36-82,
    228-243``) and 0.33.0 (the same lines, unchanged).
    Remove: when vLLM's check also compares the ranks' hosts (or shared-memory domains).
    """
    shm = _compat.cpu_shm_distributed_cls()
    if shm is None:
        return
    original = shm.make_group_name
    token = _shm_domain()

    @functools.wraps(original)
    def make_group_name(communicator):
        return f"{original(communicator)}-{token}" if token else original(communicator)

    shm.make_group_name = staticmethod(make_group_name)


def _shm_domain() -> str:
    """Names the ``/dev/shm`` this process sees: equal on two ranks iff they share it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip().replace("-", "")[:12]
        return f"{boot}{os.stat('/dev/shm').st_dev:x}"
    except OSError:
        return ""
