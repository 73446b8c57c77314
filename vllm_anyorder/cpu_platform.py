"""vLLM's CPU platform plus Ray support (selected by :func:`vllm_anyorder.platform.activate`).

Ray places each vLLM worker into one bundle of a placement group whose bundles hold
``{ray_device_key: 1}``. On CPU that key is ``"CPU"``: a rank is one of the node's CPUs in
Ray's accounting (``ray start --num-cpus``); nothing has to be declared by hand. Everything
else is inherited from ``CpuPlatform`` unchanged, so deployments that do not use Ray behave
exactly as with the stock platform.
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


def _on_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return isinstance(current_platform, AnyorderCpuPlatform)
