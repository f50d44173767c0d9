#!/usr/bin/env bash
# On the GPU machine: GPU tests, the CTC host-time profile, then the benchmarks; logs and JSON under $OUT
# (or ./out).
# usage: bash benchmarks/device_run.sh [tests|wntests|ctc|rnnt|wavenet|wnprobe|all] [extra benchmark args...]
set -uo pipefail
what=${1:-all}; shift || true
out=${OUT:-out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())" | tee -a "$out/gpu.txt"
rc=0
if [[ $what == tests || $what == all ]]; then
  python3 -m pytest -m gpu -q tests 2>&1 | tee "$out/pytest_gpu.log" | tail -25
  rc=${PIPESTATUS[0]}
fi
if [[ $what == wntests ]]; then
  python3 -m pytest -m gpu -q tests/test_wavenet_*.py 2>&1 | tee "$out/pytest_gpu.log" | tail -25
  rc=${PIPESTATUS[0]}
fi
if [[ $what == wnprobe ]]; then
  python3 benchmarks/wavenet_probe.py 2>&1 | tee "$out/wavenet_probe.jsonl"
fi
if [[ $what == wavenet || $what == all ]]; then
  python3 -m speechkernels.bench wavenet --json "$out/wavenet.json" "$@" 2>&1 | grep -v -i "warn" | tee "$out/bench_wavenet.log"
fi
if [[ $what == ctc || $what == all ]]; then
  python3 benchmarks/host_profile_ctc.py 2>&1 | grep -v -i warn > "$out/host_profile_ctc.log"; head -40 "$out/host_profile_ctc.log"
  python3 -m speechkernels.bench ctc --json "$out/ctc.json" --plot "$out/ctc.png" "$@" 2>&1 \
    | grep -v -i "warn\|kernels:" | tee "$out/bench_ctc.log"
fi
if [[ $what == rnnt || $what == all ]]; then
  python3 -m speechkernels.bench rnnt --json "$out/rnnt.json" "$@" 2>&1 | grep -v -i "warn" | tee "$out/bench_rnnt.log"
fi
exit $rc
