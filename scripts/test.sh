#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite (core, adapters, plugin, e2e, server).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest -q -rs "$@"
