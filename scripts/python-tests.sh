#!/usr/bin/env bash
# The Python stage of the test command: builds the `vans` wheel from bindings/python
# (maturin, release profile), installs it into a virtual environment under target/ with torch,
# lints the Python code (ruff, ruff.toml), and runs the pytest suite (real clusters of
# processes on 127.0.0.1, the training examples on small configurations, the book's Python
# and PyTorch snippets, vans.torch against Gloo, vans.tensorflow's ops, Keras layer and
# server protocols; tensorflow-cpu and tf-keras are installed there too).
#   VANS_PY_VENV=DIR   the virtual environment (default target/py-venv; made when missing)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv=${VANS_PY_VENV:-target/py-venv}
# No wheel cache: torch's wheels would take as much disk again in ~/.cache/pip.
export PIP_NO_CACHE_DIR=1
if [ ! -x "$venv/bin/python" ]; then
    echo "== python: creating the virtual environment $venv"
    python3 -m venv "$venv"
fi
# torch first, and only when missing: it is large (about 5 GB with the CUDA libraries PyPI's
# wheel pulls, which CPU code never loads) and the same virtual environment keeps it between
# runs. The vans.torch tests (tests/test_torch.py) need it.
if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
    echo "== python: installing torch into $venv (pip install torch; about a minute)"
    start=$(date +%s)
    "$venv/bin/python" -m pip install --quiet "torch>=2.1"
    echo "== python: torch installed in $(( $(date +%s) - start ))s"
fi
# tensorflow-cpu likewise (about 600 MB), for vans.tensorflow's tests (tests/test_tensorflow.py)
# and the DLRM example's TensorFlow modes; its ops are compiled on first use with c++.
if ! "$venv/bin/python" -c "import tensorflow" >/dev/null 2>&1; then
    echo "== python: installing tensorflow-cpu into $venv (pip install tensorflow-cpu)"
    start=$(date +%s)
    "$venv/bin/python" -m pip install --quiet "tensorflow-cpu>=2.15"
    echo "== python: tensorflow-cpu installed in $(( $(date +%s) - start ))s"
fi
# Keras 2 (tf_keras), for model.fit under ParameterServerStrategy in tests/test_tf_runtime.py:
# Keras 3 has no such strategy. Without its dependencies: they would pull the `tensorflow`
# package over `tensorflow-cpu`; the version matches the installed TensorFlow's.
if ! "$venv/bin/python" -c "import tf_keras" >/dev/null 2>&1; then
    tf_minor=$("$venv/bin/python" -c "import tensorflow as tf; print('.'.join(tf.__version__.split('.')[:2]))")
    echo "== python: installing tf-keras~=$tf_minor.0 into $venv (pip install --no-deps)"
    "$venv/bin/python" -m pip install --quiet --no-deps "tf-keras~=$tf_minor.0"
fi
# ruff, pinned (a newer one may add rules): the Python lint, as ruff.toml at the top says.
ruff_version=0.17.6
if [ "$("$venv/bin/python" -m ruff --version 2>/dev/null)" != "ruff $ruff_version" ]; then
    "$venv/bin/python" -m pip install --quiet "ruff==$ruff_version"
fi
echo "== python: ruff check (the wheel's package, tests and examples; scripts/)"
"$venv/bin/python" -m ruff check .
echo "== python: building and installing the wheel (pip install ./bindings/python[test,plot,torch])"
start=$(date +%s)
"$venv/bin/python" -m pip install --quiet "./bindings/python[test,plot,torch]"
echo "== python: wheel built and installed in $(( $(date +%s) - start ))s"
echo "== python: pytest bindings/python/tests (test_torch.py: the torch.distributed backend)"
# From the tests' folder, so `import vans` finds the installed wheel, not the sources.
cd bindings/python/tests
exec "../../../$venv/bin/python" -m pytest -q -p no:cacheprovider .
