#!/usr/bin/env bash
# Pack DALI for the GPU machine, which has no DALI and takes at most 64 MiB per device call:
# the installed nvidia-dali-cuda120 with the nvimgcodec and nvjpeg it loads, pruned to CPython
# 3.12 (the GPU machine's), plus its pure-Python and cp312 dependencies, xz-compressed (~250 MB)
# and split into .dali/p0/part0 (22 MB: it rides along with data/gpu-photos) and .dali/pN/partN
# (57 MB each). benchmarks/gpu_check.sh `dali` unpacks /tmp/dali-parts/part* there.
#   usage: bash benchmarks/dali_parts.sh [SITE_PACKAGES]   (default: .venv's)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
site="${1:-$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/tree/nvidia" "$work/wheels"
cp -a "$site/nvidia/dali" "$site/nvidia/nvimgcodec" "$site/nvidia/nvjpeg" "$work/tree/nvidia/"
cp -a "$site"/nvidia_dali_cuda120-*.dist-info "$site"/nvidia_nvimgcodec_cu12-*.dist-info "$site"/nvidia_nvjpeg_cu12-*.dist-info "$work/tree/"
(
  cd "$work/tree/nvidia"
  rm -rf dali/include nvimgcodec/include nvjpeg/include nvimgcodec/nvimgcodec_impl.* \
    nvimgcodec/extensions/libnvjpeg2k_ext* nvimgcodec/extensions/libnvtiff_ext*
  find . -name __pycache__ -prune -exec rm -rf {} +
  for f in dali/backend_impl.cpython-* dali/python_function_plugin.cpython-*; do
    case $f in *cpython-312-*) ;; *) rm "$f" ;; esac
  done
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$work/wheels" "astunparse==1.6.3" "gast==0.6.0" optree nvtx makefun "libcst~=1.8"
for w in "$work"/wheels/*.whl; do python3 -m zipfile -e "$w" "$work/tree"; done
tar -cf - -C "$work/tree" . | xz -T0 -6 >"$work/dali.tar.xz"
rm -rf .dali
mkdir -p .dali/p0
head -c 22000000 "$work/dali.tar.xz" >.dali/p0/part0
tail -c +22000001 "$work/dali.tar.xz" | split -b 57123624 -d -a 1 - "$work/rest."
n=1
for f in "$work"/rest.*; do mkdir -p ".dali/p$n" && mv "$f" ".dali/p$n/part$n" && n=$((n + 1)); done
grep -qx "/.dali/" .git/info/exclude || echo "/.dali/" >>.git/info/exclude
ls -l .dali/*/
