"""vLLM's CPU platform plus Ray support (selected by :func:`vllm_anyorder.platform.activate`).

Ray places each vLLM worker into one bundle of a placement group whose bundles hold
``{ray_device_key: 1}``. On CPU that key is ``"CPU"``: a rank is one of the node's CPUs in
Ray's accounting (``ray start --num-cpus``); nothing has to be declared by hand. One more
hook: before a TP / PP group's communicator is made, the shared-memory segments earlier
engines left are removed (patch ``cpu_shm_stale_segments``).
Everything else is inherited from ``CpuPlatform`` unchanged.
"""

from __future__ import annotations

from vllm.platforms.cpu import CpuPlatform


class AnyorderCpuPlatform(CpuPlatform):
    @property
    def ray_device_key(self) -> str:  # type: ignore[override]
        # Only Ray code paths read this key; they are the ones that need the shims (installed
        # here, in whichever process asks first: the engine core, then each Ray worker actor,
        # before Ray is asked for the actor's devices).
        from vllm_anyorder import patches

        patches.apply("ray_cpu", on_cpu_platform=_on_cpu_platform)
        patches.apply("cpu_shm_per_node")  # TP groups that span nodes: gloo, not /dev/shm
        return "CPU"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        # asked by every process that builds a TP / PP group, just before its communicator
        # (and the shared-memory all-reduce) is made: the moment to clear what earlier
        # engines left (importing that module at register() cost 2-3 s)
        from vllm_anyorder import patches

        patches.apply("cpu_shm_stale_segments")
        return super().get_device_communicator_cls()


def _on_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return isinstance(current_platform, AnyorderCpuPlatform)
