#!/usr/bin/env bash
# Set up (if needed) and run the main job: the same prompts through vLLM with and without
# `jacobi` on the embedded default model; prints equality, tokens per target forward, speed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python examples/jacobi_demo.py "$@"
