#!/usr/bin/env bash
# What a lent GPU machine lacks, packed on this machine for `bench/gpu_session.sh` (bench/README.md), under .gl/ (git-ignored):
#   .gl/tvm/            the first part of TVM 0.27's compiler library, xz'd, as much as a call carries beside the tree: call 1's carry
#   .gl/rest/           the rest of that library, the rest of TVM's wheel (less its C++ sources, headers and web runtime),
#                       Ray 2.60 as the benches use it (~13 MiB: less its jars, its RLlib, LLM, Data, Serve, Tune, Train
#                       and AIR libraries, its dashboard's web client and its binaries' symbol tables), the cp312 wheels
#                       the GPU machine's image lacks (httptools among them: the registry server imports it) and
#                       schedhub's own wheel: call 2's
# A call carries at most 64 MiB with the tree (12.2 MiB at 1dfdc82), hence the split, sized to the tree with 2 MiB to
# spare; the tree travels in both calls, so call 2 grows by twice what the tree does: 65.9 MiB at 1dfdc82 with all of
# Ray but its jars, RLlib and LLM. `strip --strip-unneeded` takes 35 MB off raylet, gcs_server and _raylet.so, the
# libraries 6 MB of xz; so packed, Ray 2.60 on Python 3.12 starts (ray.init, and `ray start --head`), runs tasks,
# actors and custom resources (checked on this machine's Python 3.12, 2026-11-30). The last lines say what each call
# carries, and fail past the limit.
# xz -9 of TVM's library takes 3–15 minutes on 2 cores: pack before the first call.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WHEELS=.whl
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | du -cb --files0-from=- | tail -1 | cut -f1)
part=$(( 62 * 1024 * 1024 - tree ))  # call 1 carries the tree and one part
rm -rf .gl/tvm .gl/rest  # a part left by an earlier, longer split would be joined to this one's
mkdir -p "$WHEELS" .gl/tvm .gl/rest
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --no-deps -d "$WHEELS" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
    apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1 ray==2.60.0 lmdb==3.0.0 starlette==1.10.0 uvicorn==0.54.0 httptools h11 \
    xgboost-cpu tornado jsonschema jsonschema-specifications referencing rpds-py attrs sniffio cuda-bindings==13.5.0 cuda-pathfinder
"$PY" -m pip wheel -q --no-deps -w "$WHEELS" .
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
here=$PWD
(cd "$work" && unzip -q "$here/$WHEELS"/apache_tvm-0.27.0.post1-*.whl && rm -rf tvm/3rdparty tvm/src tvm/web tvm/include \
    && tar cf - --exclude=tvm/lib/libtvm_compiler.so tvm apache_tvm-0.27.0.post1.dist-info | xz -9 -T2 > "$here/.gl/rest/tvm-rest.tar.xz" \
    && tar cf - tvm/lib/libtvm_compiler.so | xz -9 -T2 | split -b "$part" -d - "$here/.gl/tvm/tvm-lib.tar.xz.part")
for f in .gl/tvm/tvm-lib.tar.xz.part*; do [ "$f" = .gl/tvm/tvm-lib.tar.xz.part00 ] || mv "$f" .gl/rest/; done  # call 2 carries the rest
(cd "$work" && rm -rf tvm apache_tvm-* && unzip -q "$here/$WHEELS"/ray-2.60.0-*.whl && rm -rf ray/jars ray/rllib ray/llm ray/data ray/serve ray/tune ray/train ray/air ray/dashboard/client \
    && strip --strip-unneeded ray/_raylet.so ray/core/src/ray/raylet/raylet ray/core/src/ray/gcs/gcs_server \
    && tar cf - ray ray-2.60.0.dist-info | xz -9 -T2 > "$here/.gl/rest/ray.tar.xz")
for w in apache_tvm_ffi attrs cuda_bindings cuda_pathfinder h11 httptools jsonschema-4 jsonschema_specifications lmdb referencing rpds_py \
         sniffio starlette tornado uvicorn xgboost_cpu schedhub; do
    cp "$WHEELS"/"$w"*.whl .gl/rest/
done
carries() {  # says what device call $1 carries (the tree and folder $2); fails past 64 MiB
    local carried=$(( tree + $(du -sb "$2" | cut -f1) ))
    echo "call $1 carries the tree and $2: $(awk -v b="$carried" 'BEGIN { printf "%.1f", b / 1048576 }') MiB of 64"
    [ "$carried" -le $(( 64 * 1024 * 1024 )) ] || { echo "call $1 is over the 64 MiB a call carries" >&2; return 1; }
}
fits=0
carries 1 .gl/tvm || fits=1
carries 2 .gl/rest || fits=1
exit "$fits"
