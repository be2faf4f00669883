#!/usr/bin/env bash
# Every GPU check in one command, for a lent GPU machine with no package registry (Python
# 3.12 with torch + CUDA and torchvision): the wheels the project needs besides those, and
# libjpeg-turbo's headers as Debian packages, travel in .whl/.  Logs and tables go to $OUT
# (or ./gpu-out); $OUT/steps.log says how each step ended.
#
# Prepare .whl/ here, on the machine with pip and apt (`bash benchmarks/gpu_check.sh
# --prepare`): x86-64 Python 3.12 wheels of the versions this project's own install has,
# pinned by pip freeze (aiobotocore pins its botocore to a few releases, and the newest
# botocore is outside them), and libjpeg-turbo's two Debian packages in .whl/deb
# (20 MB; add nvidia-nvimgcodec-cu13, 25 MB, for bench_gpu_decode's nvImageCodec row), and
# carry it; the tables come back as one archive (a call returns at most 8 files):
#   run(command="R=$OUT; export OUT=/tmp/g; timeout 560 bash benchmarks/gpu_check.sh first;
#       tar czf $R/g.tgz -C /tmp g", carry=[".whl"], timeout_s=590)
#
# Run: bash benchmarks/gpu_check.sh [--dry] [first|second|STEP ...], STEP one of tests,
# gpu-decode-tests, upload, decode, node, scale, loader, neighbour (or --prepare, above).
# A lent machine has 15 minutes in all, each start counted: two calls of ~5 minutes each,
#   first:  tests upload decode  (the CUDA tests, the uploader, GPU decode on 4 and 8 cores)
#   second: node scale loader    (8 ranks against the node's stock ceiling, unbound and
#           bound to 2 CPUs each, one loader with 1-4 engine processes, one loader
#           against the RAM decode ceiling of all cores)
# (default: both; on an H100 machine, 2026-11-27, with 3,000 images the five steps of the
# time took ~6.5 minutes besides scale, so the sizes are now 2,000 images).  neighbour:
# bench_neighbour.py on the machine's cores.  Each step is bounded; steps.log says how long
# each took of its bound.
#
# --dry: on any machine (the CPU development machine, CI), with the environment as it is
# (nothing installed from .whl/, nothing built): every step starts at a tiny size, the
# CUDA tests skip, GPU decode's benchmark plays the GPU's part on the CPU; the script
# itself is what is checked (tests/test_gpu_check.py runs it).  Exit status: 0 when no
# step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS="aiobotocore botocore diskcache jmespath aioitertools aiohttp"
if [ "${1:-}" = "--prepare" ]; then
    pins=$(python3 -m pip freeze | grep -iE "^(${WHEELS// /|})==")
    if [ "$(echo "$pins" | grep -c .)" != 6 ]; then
        echo "pip freeze here does not name all of $WHEELS: install the project first" >&2
        exit 1
    fi
    mkdir -p .whl/deb
    for name in $WHEELS; do rm -f .whl/"$name"-*.whl; done # one version of each, or none installs
    # shellcheck disable=SC2086  # pins: one argument each
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl $pins || exit 1
    rm -f .whl/deb/libjpeg62-turbo*.deb
    (cd .whl/deb && apt-get download -q libjpeg62-turbo libjpeg62-turbo-dev) || {
        echo "apt-get download of libjpeg-turbo failed (apt-get update first?)" >&2
        exit 1
    }
    ls .whl .whl/deb
    du -sh .whl
    exit 0
fi
DRY=0
if [ "${1:-}" = "--dry" ]; then
    DRY=1
    shift
fi
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
: >"$OUT/steps.log"
steps=${*:-first second}
steps=${steps//first/tests upload decode}
steps=${steps//second/node scale loader}
export PYTHONUNBUFFERED=1
if [ "$DRY" = 1 ]; then
    # Tiny sizes: the script and the benchmarks' arguments are what a dry run checks.
    # One epoch measured, and no simulated training step in the upload step: the same
    # code paths at a fraction of the CPU (the dry run is part of the test suite).
    IMAGES=64 REPEAT=1 RANKS=2 BIND=1 ENGINES=1 EPOCHS=1 KEEP_UP=0
    # GPU decode's benchmark with its GPU part played on the CPU (bench_gpu_decode --dry).
    DECODE="--dry --cores 1 --epochs 1 --batch-size 16"
else
    IMAGES=2000 REPEAT=2 RANKS=8 BIND=2 ENGINES=inline,1,2,4 EPOCHS=2 KEEP_UP=1.5
    DECODE="--cores 4,8"
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
fi
{
    nvidia-smi -L 2>/dev/null || echo "no nvidia-smi here"
    # One interpreter for all of it (torch takes seconds to import).
    python3 - <<'PY'
import sys

import PIL
import torch

cuda = torch.cuda.is_available()
print(sys.version.split()[0], "torch", torch.__version__, "cuda", cuda, "Pillow", PIL.__version__)
try:
    import torchvision

    print("torchvision", torchvision.__version__)
except Exception as exc:  # not installed, or built for another torch
    print("no torchvision here:", repr(exc))
import aiobotocore
import aiohttp
import botocore

print("aiobotocore", aiobotocore.__version__, "botocore", botocore.__version__, "aiohttp",
      aiohttp.__version__)
import asyncloader._decode._image as i

print("ROI_DECODE", i.ROI_DECODE, "FAST_RESIZE", i.FAST_RESIZE)
print("CUDA", int(cuda))
PY
    nproc
} 2>&1 | tee "$OUT/env.log"
CUDA=$(sed -n 's/^CUDA \([01]\)$/\1/p' "$OUT/env.log")
CUDA=${CUDA:-0}
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
failed=0

# run STEP NEEDS_CUDA TIMEOUT LOG COMMAND...: the step's command, its end in steps.log.
run() {
    local step=$1 cuda=$2 limit=$3 log=$4
    shift 4
    echo "== $step" | tee -a "$OUT/steps.log"
    if [ "$cuda" = 1 ] && [ "$CUDA" = 0 ] && [ "$DRY" = 0 ]; then
        echo "STEP $step: FAILED (no CUDA device)" | tee -a "$OUT/steps.log"
        failed=1
        return
    fi
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$log" 2>&1
    local rc=$?
    local took="$((SECONDS - start)) s of $limit"
    tail -30 "$OUT/$log"
    if [ $rc = 0 ]; then
        echo "STEP $step: ok ($took)" | tee -a "$OUT/steps.log"
    elif [ "$cuda" = 1 ] && [ "$CUDA" = 0 ] && grep -q "needs a CUDA device" "$OUT/$log"; then
        echo "STEP $step: skipped (no CUDA device)" | tee -a "$OUT/steps.log"
    else
        echo "STEP $step: FAILED (exit $rc, $OUT/$log, $took)" | tee -a "$OUT/steps.log"
        failed=1
    fi
}

for step in $steps; do
    case $step in
    tests)
        # The CUDA tests with the default engine processes (skipped without a device: the
        # step then checks that they are collected).
        run tests 0 100 tests.log python3 -m pytest -q -p no:cacheprovider -p no:benchmark -m cuda \
            tests/test_upload.py tests/test_torch.py tests/test_gpu_decode.py tests/test_shipped.py
        ;;
    gpu-decode-tests)
        run gpu-decode-tests 0 120 gpu-decode-tests.log python3 -m pytest -q \
            -p no:cacheprovider -p no:benchmark tests/test_gpu_decode.py
        ;;
    upload)
        run upload 0 150 upload.log python3 benchmarks/bench_upload.py --images "$IMAGES" \
            --keep-up "$KEEP_UP"
        ;;
    decode)
        # GPU decode shipped by engine processes and inline, against CPU decode, on 4 and 8
        # cores: one round (seven cases of ~15 s each, then the pixels over ~250 batches).
        # shellcheck disable=SC2086  # DECODE: several arguments
        run decode 1 240 decode.log python3 benchmarks/bench_gpu_decode.py \
            --images "$IMAGES" --rounds 1 $DECODE
        ;;
    neighbour)
        run neighbour 0 300 neighbour.log python3 benchmarks/bench_neighbour.py \
            --images "$IMAGES" --repeat "$REPEAT"
        ;;
    scale)
        # The real decode at each engine count (the trivial and GIL-bound decode hooks of
        # bench_scale's full grid took over 80 s on a 16-core H100 machine, 2026-11-27).
        run scale 0 120 scale.log python3 benchmarks/bench_scale.py --images "$IMAGES" \
            --repeat 1 --epochs "$EPOCHS" --json "$OUT/scale.json" \
            --cases "$(echo "$ENGINES" | sed 's/\([^,]*\)/\1:thread:real/g')"
        ;;
    loader)
        run loader 0 180 loader.log python3 benchmarks/bench_loader.py --images "$IMAGES" \
            --latencies 0.02 --skip-dataloader --inline --repeat "$REPEAT" --epochs 1 \
            --json "$OUT/loader.json"
        ;;
    node)
        # RANKS ranks on the machine's cores, each a default loader (the node's CPU budget
        # shared), the same ranks bound by taskset to BIND CPUs each (each rank's budget
        # its own CPUs), against RANKS stock DataLoaders decoding from RAM; total threads.
        run node 0 210 node.log python3 benchmarks/bench_node.py --nproc "$RANKS" \
            --bind "$BIND" --images "$IMAGES" --repeat "$REPEAT" --epochs "$EPOCHS" \
            --json "$OUT/node.json"
        ;;
    *)
        echo "STEP $step: FAILED (no such step)" | tee -a "$OUT/steps.log"
        failed=1
        ;;
    esac
done
exit $failed
