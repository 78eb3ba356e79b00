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
# --prebuilt DIR skips the build: DIR holds a CUDA build made elsewhere (nvcc needs no
# GPU; bench/llama_build.py --cuda ARCH --pack DIR writes one), llama-server and its
# libraries, for a device whose minutes are better spent measuring than compiling.
# --site DIR installs the wheels of DIR with pip --target into the scratch folder, no
# venv, over the machine's own Python packages (numpy and the like), for a device image
# that has most of them: only the server's and the model tests' own need to travel.
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD
DRY=0 PIP_CUDA=0 QUICK=0
OUT_DIR=${OUT:-$REPO/gpu-check}
SCRATCH=${TMPDIR:-/tmp}/kvserve-gpu-check
PY=${PYTHON:-python3}
ARCH="" SDIST="" WHEELS="" MODEL="" PREBUILT="" SITE="" JOBS=$(nproc 2>/dev/null || echo 4)
VERSION=$(sed -n 's/^ *"llama-cpp-python==\([0-9.]*\)",.*/\1/p' pyproject.toml | head -1)

usage() { sed -n '2,30s/^# \{0,1\}//p' "$0"; exit "${1:-0}"; }
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
        --prebuilt) PREBUILT=$(realpath "$2"); shift ;;
        --site) SITE=$(realpath "$2"); shift ;;
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
# kvserve on its defaults and with exact reuse, against llama-server (exact reuse is
# measured at load and refused where no bound holds: it goes last, so a refusal costs no
# other row)
AGENT_SERVERS=kvserve,llama-server,kvserve-exact
# a GPU decodes a request in well under a second: more of them, and two rounds, for a steadier median
REQUESTS="32 --rounds 2" AGENTS="--shape default" WIDE="--shape wide" TOKENS=128
[ "$QUICK" = 1 ] && REQUESTS=4 AGENTS="--shape default --agents 6 --turns 2" WIDE="" TOKENS=32

step figures "nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv"
if [ -n "$SITE" ]; then
    # no venv: the wheels go to a folder that PYTHONPATH puts before the machine's packages
    step log "$PY -m pip install -q --no-index --no-deps --no-compile --target $SCRATCH/site $SITE/*.whl"
    export PYTHONPATH=$SCRATCH/site:$REPO${PYTHONPATH:+:$PYTHONPATH}
    echo "+ export PYTHONPATH=$PYTHONPATH"
    VPY=$PY
else
    step log "$PY -m venv $VENV"
    step log "$VPY -m pip install -q --upgrade pip $PIP_OFFLINE || true"
    if [ "$PIP_CUDA" = 1 ]; then
        step log "CMAKE_ARGS='-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$ARCH' CMAKE_BUILD_PARALLEL_LEVEL=$JOBS $VPY -m pip install -q --no-binary llama-cpp-python $PIP_OFFLINE $SRC_SPEC"
    else
        step log "$VPY -m pip install -q $PIP_OFFLINE llama-cpp-python==$VERSION"
    fi
    step log "$VPY -m pip install -q $PIP_OFFLINE -e '.[test]'"
fi
if [ -n "$PREBUILT" ]; then
    # llama-server and, beside it, the CUDA libllama.so and libggml*.so it was linked with
    LIB_DIR=$PREBUILT
    # their run path names the build tree of the machine that built them
    export LLAMA_SERVER=$PREBUILT/llama-server MTMD_CPP_LIB=$PREBUILT
    export LD_LIBRARY_PATH=$PREBUILT${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "+ export LLAMA_SERVER=$LLAMA_SERVER MTMD_CPP_LIB=$PREBUILT LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    step figures "cat $PREBUILT/BUILD.txt; $LLAMA_SERVER --version 2>&1 | grep -E '^(version|built)'"
else
    # llama-server and, beside it in build/bin, the CUDA libllama.so and libggml*.so
    step figures "$VPY bench/llama_build.py --cuda $ARCH --target llama-server -j $JOBS"
    if [ "$DRY" = 1 ]; then
        LIB_DIR='<the CUDA build tree>/build/bin'
    else
        LIB_DIR=$($VPY -c "from bench import llama_build as b; print(b.build_for(flags=b.configured_flags()).build_dir / 'bin')")
    fi
fi
if [ "$PIP_CUDA" = 0 ]; then
    export LLAMA_CPP_LIB_PATH=$LIB_DIR
    echo "+ export LLAMA_CPP_LIB_PATH=$LIB_DIR"
fi
step figures "$VPY -c 'from engine.llama import gpu_offload_supported as g; print(\"llama-cpp-python offloads to the GPU:\", g()); assert g()'"
# The measurements first, each within its own limit, so that a slow step leaves the next
# its time and the whole check fits one 10-minute command (what a step printed before
# its limit is kept in the figures).
step figures "timeout 100 $VPY bench/compare.py --servers kvserve,llama-server --requests $REQUESTS"
step figures "timeout 150 $VPY bench/agents.py --servers $AGENT_SERVERS $AGENTS"
[ -n "$WIDE" ] && step figures "timeout 90 $VPY bench/agents.py --servers $AGENT_SERVERS $WIDE"
step figures "timeout 80 $VPY bench/server_cost.py --tokens $TOKENS --threads 2"
# The model tests on the CUDA build (the engine's file: about 2 minutes on a CPU). They
# build their engines with the settings' defaults, n_gpu_layers 0: they check that this
# build computes what the CPU one does, the benchmarks above put the layers on the GPU.
# Only pytest-asyncio is loaded: a CUDA image's own pytest plugins may not fit this pytest.
step figures "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout 100 $VPY -m pytest -q -p no:cacheprovider -p pytest_asyncio.plugin -m model tests/integration/test_engine.py 2>&1 | tail -3"
[ "$DRY" = 1 ] || echo "figures: $FIGURES"
