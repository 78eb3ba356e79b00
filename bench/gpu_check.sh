#!/usr/bin/env bash
# The device check (issue 30 item 5): on a CUDA machine, build llama.cpp with CUDA, run
# kvserve's model tests and the benchmarks against a CUDA llama-server with the model on
# the GPU, and write every figure to one file. Meant to fit one 10-minute command.
#
#   bash bench/gpu_check.sh --dry-run            # print every step, run none (any machine)
#   bash bench/gpu_check.sh --out DIR            # DIR/gpu_check.md (default: $OUT, else ./gpu-check)
#
# Steps: the GPU's name and compute capability; a scratch venv; ONE CUDA build of the
# llama.cpp vendored in llama-cpp-python's sdist (bench/llama_build.py --cuda ARCH,
# llama-server and the shared libraries beside it), which both servers then run on:
# llama-cpp-python's Python package is installed as is and pointed at the CUDA
# libllama.so with LLAMA_CPP_LIB_PATH, so kvserve and the peer are the same compiled
# llama.cpp. --pip-cuda builds llama-cpp-python itself instead (CMAKE_ARGS=-DGGML_CUDA=on,
# a second compile of the same sources: on 16 cores the two may not fit 10 minutes).
# Then the model tests (-m model, the engine's file), bench/compare.py and
# bench/agents.py (kvserve and llama-server, every layer on the GPU), and
# bench/server_cost.py.
#
# Offline machines (the device machine reaches nothing): --sdist FILE (the
# llama-cpp-python sdist; python bench/llama_build.py keeps none, `pip download
# --no-binary :all: --no-deps llama-cpp-python==VERSION` fetches it) and --wheels DIR
# (every wheel `pip install -e .[test]` needs, for the machine's Python), and --model.
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD
DRY=0 PIP_CUDA=0 QUICK=0
OUT_DIR=${OUT:-$REPO/gpu-check}
SCRATCH=${TMPDIR:-/tmp}/kvserve-gpu-check
PY=${PYTHON:-python3}
ARCH="" SDIST="" WHEELS="" MODEL="" JOBS=$(nproc 2>/dev/null || echo 4)
VERSION=$(sed -n 's/^ *"llama-cpp-python==\([0-9.]*\)",.*/\1/p' pyproject.toml | head -1)

usage() { sed -n '2,24s/^# \{0,1\}//p' "$0"; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) DRY=1 ;;
        --pip-cuda) PIP_CUDA=1 ;;
        --quick) QUICK=1 ;;  # smaller loads: a smoke run of the script itself
        --out) OUT_DIR=$2; shift ;;
        --scratch) SCRATCH=$2; shift ;;
        --python) PY=$2; shift ;;
        --cuda-arch) ARCH=$2; shift ;;
        --sdist) SDIST=$(realpath "$2"); shift ;;
        --wheels) WHEELS=$(realpath "$2"); shift ;;
        --model) MODEL=$(realpath "$2"); shift ;;
        --jobs) JOBS=$2; shift ;;
        -h|--help) usage ;;
        *) echo "gpu_check.sh: unknown option $1" >&2; usage 2 ;;
    esac
    shift
done

FIGURES=$OUT_DIR/gpu_check.md
VENV=$SCRATCH/venv
VPY=$VENV/bin/python

# One step: printed, then run unless --dry-run; its output goes to the log, and what it
# prints on stdout to the figures file too when the step is a measurement.
step() {
    local kind=$1; shift
    echo "+ $*"
    [ "$DRY" = 1 ] && return 0
    # A failed measurement is written down and the check goes on (the next step may
    # still say something); a failed set-up step ends it.
    if [ "$kind" = figures ]; then
        { echo; echo "## \`$*\`"; echo; } >>"$FIGURES"
        bash -c "$*" 2>>"$OUT_DIR/gpu_check.log" | tee -a "$FIGURES" \
            || echo "FAILED (exit $?; see gpu_check.log)" | tee -a "$FIGURES"
    else
        bash -c "$*" >>"$OUT_DIR/gpu_check.log" 2>&1 \
            || { echo "set-up step failed: $* (see $OUT_DIR/gpu_check.log)" >&2; exit 1; }
    fi
}

if [ "$DRY" = 0 ]; then
    command -v nvidia-smi >/dev/null || { echo "gpu_check.sh: no nvidia-smi: not a CUDA machine" >&2; exit 1; }
    mkdir -p "$OUT_DIR" "$SCRATCH"
    : >"$FIGURES"; : >"$OUT_DIR/gpu_check.log"
    echo "# GPU check, $(date -u +%FT%TZ), $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" >>"$FIGURES"
    if [ -z "$ARCH" ]; then  # "9.0" -> "90"
        ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
    fi
fi
ARCH=${ARCH:-90}  # a dry run names Hopper's
PIP_OFFLINE=${WHEELS:+--no-index --find-links $WHEELS}
export KVSERVE_LLAMA_CUDA=$ARCH BENCH_N_GPU_LAYERS=999 PYTHONUNBUFFERED=1
[ -n "$SDIST" ] && export KVSERVE_LLAMA_SDIST=$SDIST
[ -n "$MODEL" ] && export KVSERVE_BENCH_MODEL=$MODEL
SRC_SPEC=${SDIST:-llama-cpp-python==$VERSION}
REQUESTS=16 AGENTS="--shape default" TOKENS=128
[ "$QUICK" = 1 ] && REQUESTS=4 AGENTS="--shape default --agents 6 --turns 2" TOKENS=32

step figures "nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv"
step log "$PY -m venv $VENV"
step log "$VPY -m pip install -q --upgrade pip $PIP_OFFLINE || true"
if [ "$PIP_CUDA" = 1 ]; then
    step log "CMAKE_ARGS='-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$ARCH' CMAKE_BUILD_PARALLEL_LEVEL=$JOBS $VPY -m pip install -q --no-binary llama-cpp-python $PIP_OFFLINE $SRC_SPEC"
else
    step log "$VPY -m pip install -q $PIP_OFFLINE llama-cpp-python==$VERSION"
fi
step log "$VPY -m pip install -q $PIP_OFFLINE -e '.[test]'"
# llama-server and, beside it in build/bin, the CUDA libllama.so and libggml*.so
step figures "$VPY bench/llama_build.py --cuda $ARCH --target llama-server -j $JOBS"
if [ "$PIP_CUDA" = 0 ]; then
    if [ "$DRY" = 1 ]; then
        LIB_DIR='<the CUDA build tree>/build/bin'
    else
        LIB_DIR=$($VPY -c "from bench import llama_build as b; print(b.build_for(flags=b.configured_flags()).build_dir / 'bin')")
    fi
    export LLAMA_CPP_LIB_PATH=$LIB_DIR
    echo "+ export LLAMA_CPP_LIB_PATH=$LIB_DIR"
fi
step figures "$VPY -c 'from engine.llama import gpu_offload_supported as g; print(\"llama-cpp-python offloads to the GPU:\", g()); assert g()'"
# The model tests on the CUDA build (the engine's file: about 2 minutes on a CPU). They
# build their engines with the settings' defaults, n_gpu_layers 0: they check that this
# build computes what the CPU one does, the benchmarks below put the layers on the GPU.
step figures "timeout 300 $VPY -m pytest -q -p no:cacheprovider -m model tests/integration/test_engine.py 2>&1 | tail -3"
step figures "$VPY bench/compare.py --servers kvserve,llama-server --requests $REQUESTS"
step figures "$VPY bench/agents.py --servers kvserve,llama-server $AGENTS"
step figures "$VPY bench/server_cost.py --tokens $TOKENS --threads 2"
[ "$DRY" = 1 ] || echo "figures: $FIGURES"
