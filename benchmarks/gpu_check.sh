#!/usr/bin/env bash
# The GPU machine's check, run once per lent machine (docs/gpu.md, "On a GPU machine", shows its tables):
#   bash benchmarks/gpu_check.sh PART...   (PART: setup, loader, dali, parity, stall, train, video, tokens)
# Issue #20's run, in one call of at most 6 minutes once DALI's parts are there:
#   bash benchmarks/gpu_check.sh dali parity stall
# Carry .whl/ and data/gpu-photos. .whl/ holds the simplejpeg wheel for CPython 3.12 (`pip download
# --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 simplejpeg`)
# and libjpeg-turbo's Debian packages (`apt-get download libjpeg62-turbo libjpeg62-turbo-dev`),
# from which the C extension is built there. Every run installs those and converts the photos once.
#   loader  the non-DALI `gpu` tests, the loader benchmark at 4, 8 and 14 workers, threads vs
#           processes, the data-stall analysis with ResNet-50;
#   dali    installs DALI from /tmp/dali-parts (made by benchmarks/dali_parts.sh; part0 rides with
#           the photos, each other part is carried in its own call and moved there), runs every
#           `gpu` test (CUDA tensors, no copy back to the host) and train(224) for 20 epochs:
#           fastload's dali and hybrid backends against DALI's own pipeline and the CPU path
#           (images/s overall and once running);
#   parity  (needs DALI) each backend's mean |diff| per image from Pillow + torchvision's recipe,
#           val(224) and decode, DALI decoding with device="mixed" (nvJPEG);
#   stall   (needs DALI) ResNet-50 bf16, channels_last, torch.compile, fed by cpu, dali and hybrid;
#   train   (after `dali` when both are given, so DALI feeds it) the training example with nccl + bf16;
#   video   (after `dali`; carry PyAV's CPython 3.12 wheel in .whl/ and data/videos, made here by
#           benchmarks/make_videos.py) the video `gpu` tests (NVDEC's clips against the CPU path, a video
#           NVDEC cannot decode named or skipped) and benchmarks/bench_video.py --dali (fastload's DALI
#           video path against its CPU path and DALI's own fn.readers.video).
#   tokens  (nothing to carry but the tree) the `gpu` test of packed rows at the model: tiny Llama, GPT-2
#           and Qwen2 in float16 on flash-attention's varlen kernel, each document's logits as fed alone.
# Logs and JSON go to $OUT.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
parts=" ${*:-loader} "
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

if [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
  for deb in .whl/*.deb; do dpkg -x "$deb" /tmp/jpeg; done
fi
export PYTHONPATH="/tmp/site:$PWD"
if [ ! -f fastload/decode/_turbo.*cpython-312*.so ]; then
  lib=/tmp/jpeg/usr/lib/x86_64-linux-gnu
  CFLAGS="-I/tmp/jpeg/usr/include -I/tmp/jpeg/usr/include/x86_64-linux-gnu" LDFLAGS="-L$lib -Wl,-rpath,$lib" \
    python3 setup.py build_ext --inplace -q >"$OUT/build.log" 2>&1
fi
python3 -c "import fastload.decode._turbo" 2>/dev/null && echo "extension: built" || echo "extension: NOT built (simplejpeg path), see build.log"
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
echo "machine: $gpu, $(nproc) CPU cores, python $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)'), $(date -u +%Y-%m-%d)"
[ -d /tmp/photos-wds ] || [ "$parts" = " tokens " ] || python3 -m fastload.cli convert data/gpu-photos /tmp/photos-wds --from imagefolder --shard-size 16MB --workers 8 --quiet

if [[ $parts == *" loader "* ]]; then
  echo "== gpu tests without DALI"
  python3 -m pytest -m gpu -q -p no:cacheprovider tests/backends/test_gpu.py 2>&1 | tail -3
  echo "== loader: fastload vs torch+Pillow (train(224), uint8, batch 256)"
  python3 -m fastload.cli bench /tmp/photos-wds --source data/gpu-photos --backends fastload-cpu,torch --workers 4,8,14 \
    --epochs 2 --json "$OUT/loader.json" --plot "$OUT/loader.png" 2>&1 | tail -9
  echo "== data stall: ResNet-50, bf16, fed by fastload (14 workers)"
  python3 -m fastload.cli bench /tmp/photos-wds --backends fastload-cpu --workers 14 --model resnet50 --steps 30 \
    --json "$OUT/stall.json" 2>&1 | tail -5
  echo "== threads vs processes (8)"
  python3 benchmarks/bench_threads.py /tmp/photos-wds --workers 8 --batches 16 2>&1 | tail -1
fi

if [[ $parts == *" dali "* ]]; then
  if ! python3 -c "import nvidia.dali" 2>/dev/null; then
    unxz="xz -d -T0"; command -v xz >/dev/null || unxz="python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)'"
    cat /tmp/dali-parts/part* | eval "$unxz" | tar -x -C "$site" || exit 1
  fi
  python3 -c "import nvidia.dali as d; print('dali', d.__version__)" || exit 1
  echo "== every gpu test"
  timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/backends/test_gpu.py tests/backends/test_dali.py 2>&1 | tee "$OUT/pytest-gpu.log" | tail -4
  echo "== DALI on the GPU, train(224), batch 256, 20 epochs"
  timeout 150 python3 -m fastload.cli bench /tmp/photos-wds --backends fastload-dali,fastload-hybrid,dali-gpu,fastload-cpu \
    --workers 14 --transform train --epochs 20 --json "$OUT/dali-train.json" 2>&1 | tail -7
fi

if [[ $parts == *" parity "* ]]; then
  for t in val decode; do
    echo "== parity, $t(224): mean |diff| per image from Pillow + torchvision's recipe (dali: device=mixed)"
    timeout 90 python3 -m fastload.bench.parity /tmp/photos-wds --backends cpu,dali --transform $t --workers 14 \
      --json "$OUT/parity-$t.json" 2>&1 | grep -v "^fastload: backend"
  done
fi

if [[ $parts == *" stall "* ]]; then
  echo "== data stall: ResNet-50 bf16 channels_last torch.compile, train(224), batch 256, 14 workers"
  timeout 200 python3 benchmarks/bench_stall.py /tmp/photos-wds --backends cpu,dali,hybrid --workers 14 --steps 15 \
    --json "$OUT/stall.json" 2>&1 | grep -v "^fastload: backend" | tail -5
fi

if [[ $parts == *" train "* ]]; then
  echo "== train_ddp.py on the GPU (nccl, bf16, resnet50, 224 px, batch 128)"
  timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node=1 examples/train_ddp.py \
    --data /tmp/photos-wds --epochs 3 --batch-size 128 --workers 12 --checkpoint-dir /tmp/ckpt 2>&1 \
    | grep -E "^epoch|done|Error|error" | tee "$OUT/train.log"
fi
if [[ $parts == *" video "* ]]; then
  echo "== video: NVDEC through DALI against the CPU path, 16-frame clips of stride 2, 224 px"
  [ -d /tmp/videos-wds ] || python3 -m fastload.cli convert data/videos /tmp/videos-wds --from videos --workers 8 --quiet
  timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/backends/test_dali_video.py 2>&1 | tee "$OUT/pytest-video.log" | tail -4
  timeout 240 python3 benchmarks/bench_video.py data/videos /tmp/videos-wds --rounds 2 --dali 2>&1 | tee "$OUT/video.log" | tail -8
fi
if [[ $parts == *" tokens "* ]]; then
  echo "== tokens: packed documents apart in a real flash-attention kernel (flash_attn's, else PyTorch's varlen), float16"
  timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/text/test_packed_attention.py 2>&1 | tee "$OUT/pytest-tokens.log" | tail -4
fi
echo "== gpu_check: ${SECONDS} s"
