#!/usr/bin/env bash
# Build softlight and run its GPU checks on a CUDA machine: a quick smoke test of every family
# (bounded in time, so that a hang shows up at once), the GPU test suite, then the benchmark.
#   tools/gpu_suite.sh [smoke|tests|bench|all]   (results under $OUT, default /tmp/softlight-gpu)
set -uo pipefail
OUT=${OUT:-/tmp/softlight-gpu}
mkdir -p "$OUT"
what=${1:-all}
nvidia-smi -L
if [ ! -f /tmp/sl/softlight/__init__.py ] || [ "${REBUILD:-1}" = 1 ]; then
  rm -rf /tmp/sl
  ( time python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/sl . ) 2>&1 | tail -5 || exit 1
fi
export PYTHONPATH=/tmp/sl${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ "$what" = smoke ] || [ "$what" = all ]; then
  timeout 120 python3 - <<'PY' || { echo "SMOKE FAILED"; exit 1; }
import torch, softlight
for rows, cols in [(100, 7), (100, 1000), (50, 5000), (64, 8192), (64, 65536), (16, 393216), (4, 4194304), (3, 1000003)]:
    for dt in (torch.float32, torch.bfloat16):
        x = torch.randn(rows, cols, device="cuda", dtype=dt) * 3
        y = softlight.log_softmax(x)
        torch.cuda.synchronize()
        err = (y.double() - torch.log_softmax(x.double(), -1)).abs().max().item()
        print(f"smoke {rows}x{cols} {dt}: max err {err:.2e}", flush=True)
PY
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
  python3 -m pytest tests -q -rs --timeout=300 -p no:cacheprovider 2>&1 | tee "$OUT/pytest-gpu.log" | tail -25
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 -m softlight bench --out-dir "$OUT" ${BENCH_ARGS:-}
fi
