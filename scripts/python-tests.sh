#!/usr/bin/env bash
# The Python stage of the test command: builds the `vans` wheel from bindings/python
# (maturin, release profile), installs it into a virtual environment under target/, and runs
# the pytest suite (real clusters of processes on 127.0.0.1, the training example on a small
# configuration, the README's Python snippets).
#   VANS_PY_VENV=DIR   the virtual environment (default target/py-venv; made when missing)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv=${VANS_PY_VENV:-target/py-venv}
if [ ! -x "$venv/bin/python" ]; then
    echo "== python: creating the virtual environment $venv"
    python3 -m venv "$venv"
fi
echo "== python: building and installing the wheel (pip install ./bindings/python[test,plot])"
start=$(date +%s)
"$venv/bin/python" -m pip install --quiet "./bindings/python[test,plot]"
echo "== python: wheel built and installed in $(( $(date +%s) - start ))s"
echo "== python: pytest bindings/python/tests"
# From the tests' folder, so `import vans` finds the installed wheel, not the sources.
cd bindings/python/tests
exec "../../../$venv/bin/python" -m pytest -q -p no:cacheprovider .
