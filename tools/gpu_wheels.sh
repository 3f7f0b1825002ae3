#!/usr/bin/env bash
# On a machine with network access: download into .whl/ (ignored by git) the wheels that a GPU host
# without network needs beside what it has (Python 3.12 with torch, torchvision, numpy, pillow, tqdm,
# pyyaml, setuptools, wheel, pytest). Copy the checkout with .whl/ to the GPU host, then run there:
#   bash tools/gpu_run.sh
# CUDA=12 (default 13, as the host's torch 2.11+cu130): nvImageCodec and nvJPEG for the host's torch
# (DecodeOptions(decoder="nvimgcodec"); ~25 MB + ~5 MB). Without them its figures are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl
get() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "$@"
}
get simplejpeg==1.9.0 braceexpand==0.1.7 webdataset==1.0.2 zlib-ng==1.1.0
if [ "${CUDA:-13}" = 12 ]; then
    get nvidia-nvimgcodec-cu12==0.9.0.20 'nvidia-nvjpeg-cu12~=12.0'
else
    get nvidia-nvimgcodec-cu13==0.9.0.20 'nvidia-nvjpeg~=13.0.0'
fi
ls -l .whl
