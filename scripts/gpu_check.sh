#!/usr/bin/env bash
# Run every `gpu`-marked test, then the GPU benchmarks that fit in the time left, on a CUDA host.
# Logs go under OUTDIR; a short table is printed last.
#
# Usage (on the H200 machine, from the repository root):
#   bash scripts/gpu_check.sh OUTDIR [BUDGET_S] [extra pytest args...]
# BUDGET_S (default 540) bounds the whole script: tests get what they need (each test at most 300 s), and each
# benchmark runs only if its estimated time still fits. Wheels the image lacks travel in .whl/ (see README).
set -uo pipefail
out=${1:?usage: gpu_check.sh OUTDIR [BUDGET_S] [pytest args]}; budget=${2:-540}; shift; shift || true
mkdir -p "$out"
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.35}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > "$out/gpu.txt" 2>&1
timeout $(( $(left) - 30 )) python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 300 -o junit_family=xunit1 \
  --junitxml="$out/gpu_tests.xml" "$@" > "$out/gpu_tests.log" 2>&1
rc=$?
tail -30 "$out/gpu_tests.log"
# benchmarks: name, estimated seconds, command
run_bench() {
  local name=$1 est=$2; shift 2
  if [ "$(left)" -gt "$est" ]; then
    echo "== bench $name (est ${est}s, $(left)s left) =="
    timeout $(( $(left) - 5 )) "$@" > "$out/bench_$name.log" 2>&1; echo "bench $name rc=$?" >> "$out/benches.txt"
    tail -15 "$out/bench_$name.log"
  else
    echo "bench $name skipped: est ${est}s > $(left)s left" | tee -a "$out/benches.txt"
  fi
}
run_bench sandbox 200 python3 benchmarks/sandbox_bench.py --out "$out/sandbox_bench" --builds 6 --ext-builds 2 --evals 8
echo "== summary =="; cat "$out/gpu.txt"; grep -E "passed|failed|error" "$out/gpu_tests.log" | tail -1; cat "$out/benches.txt" 2>/dev/null
grep -E "^(FAILED|ERROR)" "$out/gpu_tests.log" | head -20
exit $rc
