#!/usr/bin/env bash
# The GPU machine's check, run once per lent machine (see README "GPU machine"):
#   device run, carry [.whl, data/gpu-photos]:  bash benchmarks/gpu_check.sh
# Installs the carried wheels (.whl/), builds the libjpeg-turbo extension if it can, runs the
# `gpu` tests, the loader benchmark at several worker counts, threads vs processes, and the
# training example with nccl + bf16; prints a short table and leaves logs in $OUT.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH="/tmp/site:$PWD"
python3 setup.py build_ext --inplace -q >"$OUT/build.log" 2>&1 && echo "extension: built" || echo "extension: not built (simplejpeg path), see build.log"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "machine: $gpu, $(nproc) CPU cores, $(date -u +%Y-%m-%d)"

echo "== gpu tests"
python3 -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tail -3

echo "== convert"
python3 -m fastload.cli convert data/gpu-photos /tmp/photos-wds --from imagefolder --shard-size 16MB --workers 8 --quiet

# DALI rows need the nvidia-dali wheel there: ~300 MB, over the 64 MiB a device call can carry,
# and not in that machine's image; they run when DALI is importable.
if python3 -c "import nvidia.dali" 2>/dev/null; then
  for t in decode train; do
    echo "== DALI on the GPU, $t, batch 256"
    python3 -m fastload.cli bench /tmp/photos-wds --backends fastload-dali,dali-gpu,fastload-cpu --workers 8 --transform $t --epochs 2 --json "$OUT/dali-$t.json" 2>&1 | tail -5
  done
else
  echo "== DALI: not installed on this machine (no dali rows)"
fi
echo "== loader: fastload vs torch+Pillow (train(224), uint8, batch 256)"
for w in 4 8 14; do
  python3 -m fastload.cli bench /tmp/photos-wds --source data/gpu-photos --backends fastload-cpu,torch --workers $w --epochs 2 --json "$OUT/loader-w$w.json" 2>&1 | tail -6
done

echo "== threads vs processes (8)"
python3 benchmarks/bench_threads.py /tmp/photos-wds --workers 8 --batches 16 2>&1 | tail -1

echo "== train_ddp.py on the GPU (nccl, bf16, resnet50, 224 px, batch 128)"
timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node=1 examples/train_ddp.py \
  --data /tmp/photos-wds --epochs 3 --batch-size 128 --workers 12 --checkpoint-dir /tmp/ckpt 2>&1 \
  | grep -E "^epoch|done|Error|error" | tee "$OUT/train.log"
