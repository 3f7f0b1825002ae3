#!/usr/bin/env bash
# On a machine with network access: download into .whl/ (ignored by git) the wheels that a GPU host
# without network needs beside what it has (Python 3.12 with torch, torchvision, numpy, pillow, tqdm,
# pyyaml, setuptools, wheel, pytest). Copy the checkout with .whl/ to the GPU host, then run there:
#   bash tools/gpu_run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl simplejpeg==1.9.0 braceexpand==0.1.7 webdataset==1.0.2
ls -l .whl
