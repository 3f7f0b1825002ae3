#!/usr/bin/env bash
# Here, before a session's GPU run: the wheels the GPU host lacks (it has no network, Python 3.12,
# and torch, torchvision, numpy, pillow, tqdm, pyyaml, setuptools, wheel, pytest already), into
# .whl/ (ignored by git). Then, with the device tool:
#   run(command="bash tools/gpu_run.sh", carry=[".whl"], timeout_s=600)
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl simplejpeg==1.9.0 braceexpand==0.1.7 webdataset==1.0.2
ls -l .whl
