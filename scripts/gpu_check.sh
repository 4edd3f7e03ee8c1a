#!/usr/bin/env bash
# Run every `gpu`-marked test and the GPU benchmarks on a CUDA host, log under OUTDIR, print a short table last.
# Usage (on the H200 machine, from the repository root): bash scripts/gpu_check.sh "$OUT" [pytest -k expression]
set -uo pipefail
out=${1:?usage: gpu_check.sh OUTDIR [-k EXPR]}; shift || true
mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > "$out/gpu.txt" 2>&1
python3 -m pytest -q -m gpu -p no:cacheprovider "$@" 2>&1 | tee "$out/gpu_tests.log" | tail -40
rc=${PIPESTATUS[0]}
echo "== summary =="; cat "$out/gpu.txt"; grep -E "passed|failed|error" "$out/gpu_tests.log" | tail -1
exit $rc
