"""The ``vllm.platform_plugins`` entry point: our CPU platform only where vLLM would pick its
stock CPU platform (never on GPU or other platforms), opt-out by environment; the platform
differs from ``CpuPlatform`` only by its Ray device key."""

import importlib.metadata as metadata

import pytest

from vllm_anyorder import platform


def test_entry_point_is_registered():
    eps = [ep for ep in metadata.entry_points(group="vllm.platform_plugins")
           if ep.name == "vllm_anyorder"]
    assert len(eps) == 1 and eps[0].load() is platform.activate


@pytest.mark.parametrize("detected, expected", [
    ("vllm.platforms.cpu.CpuPlatform", platform.ANYORDER_CPU_PLATFORM),
    (None, None),  # CUDA / ROCm / XPU / TPU hosts: vLLM's CPU detection says no
    ("vllm.platforms.zen_cpu.ZenCpuPlatform", None),  # another CPU platform: left alone
])
def test_activates_only_over_the_stock_cpu_platform(detected, expected, monkeypatch):
    import vllm.platforms

    monkeypatch.setattr(vllm.platforms, "cpu_platform_plugin", lambda: detected)
    monkeypatch.delenv("VLLM_ANYORDER_CPU_PLATFORM", raising=False)
    assert platform.activate() == expected
    monkeypatch.setenv("VLLM_ANYORDER_CPU_PLATFORM", "0")
    assert platform.activate() is None


def test_platform_is_cpu_platform_with_a_ray_key_and_a_communicator_hook():
    from vllm.platforms.cpu import CpuPlatform

    from vllm_anyorder import patches
    from vllm_anyorder.cpu_platform import AnyorderCpuPlatform

    plat = AnyorderCpuPlatform()
    assert isinstance(plat, CpuPlatform) and plat.is_cpu() and plat.device_name == "cpu"
    assert CpuPlatform().ray_device_key == ""  # stock: "does not support ray"
    assert plat.ray_device_key == "CPU" and "ray_cpu" in patches.applied()
    overridden = {k for k in vars(AnyorderCpuPlatform) if not k.startswith("__")}
    # and the hook that installs cpu_shm_stale_segments (tests/plugin/test_cpu_shm_segments.py)
    assert overridden == {"ray_device_key", "get_device_communicator_cls"}
    assert plat.get_device_communicator_cls() == CpuPlatform.get_device_communicator_cls()
