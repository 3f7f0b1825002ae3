#!/usr/bin/env bash
# On a GPU host without network access: install the wheels copied into .whl/ (tools/gpu_wheels.sh
# downloads them on a machine with network) and shardify itself (editable, offline), then run every
# GPU figure into $OUT (tools/gpu_figures.py; extra arguments go to it, e.g. --groups feed step).
#   bash tools/gpu_run.sh [--groups ...]
#   bash tools/gpu_run.sh --groups decoders   # CPU path, nvJPEG, nvImageCodec, hybrid side by side (~5 min)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .
python3 -c "import shardify.reader, simplejpeg, webdataset, torch; print('shardify ready; torch', torch.__version__, 'CUDA', torch.cuda.is_available())"
python3 -c "import nvidia.nvimgcodec as n; print('nvImageCodec', n.__version__)" 2>/dev/null \
    || echo "nvImageCodec: not installed (its figures are skipped; CUDA=12|13 bash tools/gpu_wheels.sh fetches it)"
nproc; lscpu | grep -E 'Model name|Thread|Core|Socket' || true
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv || true
PYTHONUNBUFFERED=1 python3 tools/gpu_figures.py --out "${OUT:-figs}" --data /tmp/gpu-figures-data "$@"
