#!/usr/bin/env bash
# The GPU benches on a lent GPU machine (Python 3.12, CUDA 13 and PyTorch installed, no network), in as many calls of
# the `device` tool from the repository root as `bash bench/pack_for_gpu.sh` here split its pack into (bench/README.md;
# its last lines are the calls), each within the 30 s the machine stays warm after the one before:
#
#   every call but the last, carry .gl/NN:  bash bench/gpu_session.sh unpack
#   the last call, carry .gl/NN:            bash bench/gpu_session.sh run SECONDS [auto|loadaware|models|both] [NETWORK]
#
# `unpack` keeps the part it carries in /tmp/site/parts, where the next call's copy of the tree leaves it alone. `run`
# joins the parts (and says which are missing), installs them into /tmp/site (a later `run` in the same lease carries
# nothing and installs nothing), checks that CUDA kernels compile (NVRTC, else nvcc), then spends SECONDS on:
# `bench loadaware --device cuda` (4 tuning jobs against 1, and 4 with no core kept for the GPU's measurements), then
# NETWORK's row of the GPU table (default bert_layer), tuned for what time is left. `auto` (the
# default) runs loadaware only while bench/results/gpu/loadaware.json is missing, and gives the table all the time after.
# The table's registry resumes from bench/results/gpu/store.mdb.xz where the repository has it (bench.gpu_store) and
# comes back as $OUT/store.mdb.xz: commit it there, so the next lease tunes on from this one's records and log.
# Every result and log is written under $OUT.
set -u
SITE=/tmp/site
OUT=${OUT:-/tmp/out}
mkdir -p "$SITE" "$OUT"

keep() {  # keeps the part of the pack this call carries; says which parts are kept
    mkdir -p "$SITE/parts" && cp .gl/[0-9]*/pack-* "$SITE/parts/" 2>/dev/null || { echo "this call carries no part of the pack (.gl/NN)" >&2; return 1; }
    echo "kept: $(cd "$SITE/parts" && ls | tr '\n' ' ')"
}
if [ "${1:-}" = unpack ]; then
    keep || exit 2
    nvidia-smi -L; python3 -V; ls -d /usr/local/cuda*/targets/x86_64-linux/lib/libnvrtc.so* 2>/dev/null
    exit 0
fi
[ "${1:-}" = run ] || { echo "usage: bash bench/gpu_session.sh unpack | run SECONDS [auto|loadaware|models|both] [NETWORK]" >&2; exit 2; }
TOTAL=${2:-540}
WHAT=${3:-auto}
NETWORK=${4:-bert_layer}
KEPT=bench/results/gpu/store.mdb.xz
if [ "$WHAT" = auto ]; then [ -f bench/results/gpu/loadaware.json ] && WHAT=models || WHAT=both; fi
START=$(date +%s)
left() { echo $(( TOTAL - ($(date +%s) - START) )); }

if [ -f "$SITE/.installed" ]; then
    echo "installed by an earlier call of this lease"
else
    keep || exit 2
    last=$(ls .gl/[0-9]*/pack-* | tail -1); last=${last##*/}  # pack-ID-NN-of-COUNT: join this pack's parts 01 to COUNT
    pack=${last%-*-of-*}; count=${last##*-of-}
    missing=""
    for n in $(seq -f %02g 1 "$((10#$count))"); do [ -f "$SITE/parts/$pack-$n-of-$count" ] || missing="$missing $n"; done
    [ -z "$missing" ] || { echo "parts$missing of $count are not on this machine: carry each .gl/NN in a call of its own (unpack), the last with run" >&2; exit 2; }
    mkdir -p "$SITE/stage"
    cat "$SITE/parts/$pack"-*-of-"$count" | tar xf - -C "$SITE/stage" && tar xJf "$SITE/stage/tvm.tar.xz" -C "$SITE" \
        && tar xJf "$SITE/stage/ray.tar.xz" -C "$SITE" || { echo "the pack's parts did not unpack: pack again (bench/pack_for_gpu.sh)" >&2; exit 2; }
    python3 -m pip install -q --no-deps --no-index --target "$SITE" "$SITE"/stage/*.whl 2>&1 | grep -v "WARNING: Target directory" | tail -3
    rm -rf "$SITE/parts" "$SITE/stage" && touch "$SITE/.installed"
fi
export PYTHONPATH="$SITE:$PWD" PATH="/usr/local/cuda/bin:$SITE/bin:$PATH" CUDA_PATH=/usr/local/cuda
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
echo "installed in $(( $(date +%s) - START )) s"

python3 - <<'EOF' 2>&1 | tail -5 | tee "$OUT/compile-check.log"
import tvm
from tvm import te
from schedhub.tuner import cuda_build, tvm_env
from schedhub.tuner.search import default_schedule
tvm_env.prepare()
a = te.placeholder((4096,), name="A")
mod = tvm.IRModule({"main": te.create_prim_func([a, te.compute((4096,), lambda i: a[i] + 1, name="B")])})
target = tvm_env.device_target("cuda")
tvm_env.build_kernel(default_schedule(mod, target), target)
print("CUDA kernels compile with", "NVRTC in-process" if cuda_build.nvrtc_available() else "nvcc", "for", target)
EOF
grep -q "CUDA kernels compile" "$OUT/compile-check.log" || { export TVM_CUDA_COMPILE_MODE=nvcc; echo "NVRTC failed: nvcc from here on" | tee -a "$OUT/compile-check.log"; }

SHARED=""; [ "$(left)" -ge 420 ] || [ "$WHAT" = loadaware ] && SHARED="--shared-core"
LOADAWARE=$(( $(left) / 2 )); [ "$LOADAWARE" -gt 330 ] && LOADAWARE=330; [ "$WHAT" = loadaware ] && LOADAWARE=$(( $(left) - 5 ))
[ "$WHAT" = models ] || timeout "$LOADAWARE" python3 -m bench.loadaware --device cuda --jobs 4 --kernels 4 --trials 16 $SHARED --out "$OUT/loadaware.json" 2>&1 \
    | grep -v "^\s*$" | tee "$OUT/loadaware.log" | grep -E "^run|^  |sooner|trials_per_sec|wrote|Error|error" | head -40

[ "$WHAT" = loadaware ] && { echo "done with $(left) s of $TOTAL left"; exit 0; }
SEED=""
if [ -f "$KEPT" ]; then python3 -m bench.gpu_store load "$KEPT" /tmp/gpu-seed && SEED="--seed-store /tmp/gpu-seed"; fi
MINUTES=$(python3 -c "print(max(1.0, round(($(left) - 170) / 60, 1)))")
timeout $(( $(left) - 25 )) python3 -m bench.models --device cuda --networks "$NETWORK" --policy gradient --max-minutes "$MINUTES" \
    $SEED --keep-store "$OUT/gpu-store" --out "$OUT/models-$NETWORK.json" > "$OUT/models-$NETWORK.log" 2>&1
tail -25 "$OUT/models-$NETWORK.log"
[ -f "$OUT/gpu-store/data.mdb" ] && python3 -m bench.gpu_store save "$OUT/gpu-store" "$OUT/store.mdb.xz"
echo "done with $(left) s of $TOTAL left"
