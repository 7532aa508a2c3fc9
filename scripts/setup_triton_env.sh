#!/usr/bin/env bash
# Creates .venv-triton: Triton server 2.51 (nvidia-pytriton wheel) with the Python backend stub in
# place, perf_analyzer (tritonclient 2.46.0 binary), Triton Model Analyzer 1.58 and ONNX Runtime
# for the Python-based onnxruntime backend (tritonflow/runtime/backends/onnxruntime/model.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${TRITONFLOW_PYTHON:-python3.11}
VENV=$(realpath -m "${TRITONFLOW_TRITON_VENV:-.venv-triton}")
want=$(sha256sum requirements-triton.txt scripts/setup_triton_env.sh | sha256sum | cut -c1-16)
if [ "$(cat "$VENV/.tritonflow-stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "[setup] creating $VENV (Triton tools environment)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q -U pip wheel
"$VENV/bin/pip" install -q -r requirements-triton.txt
SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
TS="$SP/pytriton/tritonserver"
# The Python backend needs its stub beside libtriton_python.so.
cp "$TS/python_backend_stubs/3.11/triton_python_backend_stub" "$TS/backends/python/"
# perf_analyzer from the tritonclient 2.46.0 wheel (glibc 2.36 compatible): the `perf-analyzer`
# package (0.1.0) is a placeholder without a binary and tritonclient >= 2.65 ships none.
tmp=$(mktemp -d)
"$VENV/bin/pip" download -q --no-deps --only-binary=:all: --platform manylinux1_x86_64 \
  -d "$tmp" tritonclient==2.46.0
(cd "$tmp" && "$VENV/bin/python" -m zipfile -e tritonclient-2.46.0-*.whl x >/dev/null)
install -m 0755 "$tmp/x/tritonclient-2.46.0.data/data/bin/perf_analyzer" "$VENV/bin/perf_analyzer"
rm -rf "$tmp"
echo "$want" > "$VENV/.tritonflow-stamp"
