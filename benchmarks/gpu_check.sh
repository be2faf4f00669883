#!/usr/bin/env bash
# Every GPU check in one command, for a lent GPU machine with no package registry (Python
# 3.12 with torch + CUDA and torchvision): the wheels the project needs besides those, and
# libjpeg-turbo's headers as Debian packages, travel in .whl/.  Logs go to $OUT (or
# ./gpu-out).
#
# Prepare .whl/ on a machine with pip (x86-64, Python 3.12 wheels):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#     aiobotocore botocore diskcache jmespath aioitertools aiohttp \
#     nvidia-nvimgcodec-cu13 nvidia-nvjpeg
#   (cd .whl && mkdir -p deb && cd deb && apt-get download libjpeg62-turbo libjpeg62-turbo-dev)
#
# Run: bash benchmarks/gpu_check.sh [tests|gpu-decode-tests|upload|decode|neighbour|scale|node ...]
# (default: tests upload decode; neighbour: bench_neighbour.py on the machine's cores;
# scale: bench_scale.py with 1-4 engine processes and bench_loader.py against the RAM
# decode ceiling of all the cores, engine processes and inline interleaved; node:
# bench_node.py with 8 ranks against the node's stock ceiling)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
steps=${*:-tests upload decode}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
# libjpeg-turbo for the region decoder (_jpegroi), unpacked beside the system.
mkdir -p /tmp/jpeg
for f in .whl/deb/*.deb; do dpkg -x "$f" /tmp/jpeg; done
export LD_LIBRARY_PATH=/tmp/jpeg/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
CFLAGS="-I/tmp/jpeg/usr/include -I/tmp/jpeg/usr/include/x86_64-linux-gnu" \
    LDFLAGS="-L/tmp/jpeg/usr/lib/x86_64-linux-gnu" \
    python3 setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1 || cat "$OUT/build.log"
{
    nvidia-smi -L
    python3 -c 'import torch, torchvision, PIL, sys; print(sys.version.split()[0], "torch", torch.__version__, "torchvision", torchvision.__version__, "Pillow", PIL.__version__)'
    python3 -c 'import asyncloader._decode._image as i; print("ROI_DECODE", i.ROI_DECODE, "FAST_RESIZE", i.FAST_RESIZE)'
    nproc
} 2>&1 | tee "$OUT/env.log"
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
for step in $steps; do
    case $step in
    tests)
        timeout 300 python3 -m pytest -q -p no:cacheprovider -m cuda \
            tests/test_upload.py tests/test_torch.py tests/test_gpu_decode.py 2>&1 |
            tee "$OUT/tests.log" | tail -25
        timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_decode.py \
            tests/test_batch_lifetime.py 2>&1 | tail -3
        ;;
    gpu-decode-tests)
        timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_decode.py 2>&1 |
            tee "$OUT/gpu-decode-tests.log" | tail -8
        ;;
    upload)
        timeout 200 python3 benchmarks/bench_upload.py --images 1500 2>&1 |
            tee "$OUT/upload.log" | tail -30
        ;;
    decode)
        timeout 300 python3 benchmarks/bench_gpu_decode.py --images 4000 --cores 4 2>&1 |
            tee "$OUT/decode.log" | tail -45
        ;;
    neighbour)
        timeout 300 python3 benchmarks/bench_neighbour.py --images 3000 --repeat 3 2>&1 |
            tee "$OUT/neighbour.log" | tail -12
        ;;
    scale)
        timeout 200 python3 benchmarks/bench_scale.py --images 4000 --repeat 1 \
            --engines inline,1,2,4 2>&1 | tee "$OUT/scale.log" | tail -12
        timeout 240 python3 benchmarks/bench_loader.py --images 4000 --latencies 0,0.02 \
            --skip-dataloader --inline --repeat 2 --epochs 1 2>&1 |
            tee "$OUT/loader.log" | tail -12
        ;;
    node)
        # 8 ranks on the machine's cores, each a default loader (the node's CPU budget
        # shared), against 8 stock DataLoaders decoding from RAM; total threads at most.
        timeout 300 python3 benchmarks/bench_node.py --nproc 8 --images 4000 --repeat 2 \
            --json "$OUT/node.json" 2>&1 | tee "$OUT/node.log" | tail -10
        ;;
    esac
done
