#!/usr/bin/env bash
# What a lent GPU machine lacks, packed on this machine for `bench/gpu_session.sh` (bench/README.md): TVM 0.27's wheel
# (less its C++ sources, headers and web runtime), Ray 2.60 as the benches use it (~13 MiB: less its jars, its RLlib,
# LLM, Data, Serve, Tune, Train and AIR libraries, its dashboard's web client and its binaries' symbol tables), the
# cp312 wheels the GPU machine's image lacks (httptools among them: the registry server imports it) and schedhub's own
# wheel, as one tar stream split into as many parts as it takes: .gl/01, .gl/02, ... (git-ignored), one a device call.
# A call carries at most 64 MiB with the tree, and the tree travels in every call, so each part is 62 MiB less the
# tree (2 MiB to spare for what is committed between packing and the calls): two calls at 934be03 (tree 11.7 MiB,
# pack 95 MiB), three once the tree passes ~14.5 MiB. `strip --strip-unneeded` takes 35 MB off raylet, gcs_server and _raylet.so, the
# pruned libraries 6 MB of xz; so packed, Ray 2.60 on Python 3.12 starts (ray.init, and `ray start --head`), runs
# tasks, actors and custom resources (checked on this machine's Python 3.12, 2026-11-30). The last lines are the
# calls to make, each with what it carries; the script fails if a call would carry over 64 MiB.
# xz -9 of TVM's library takes 3–15 minutes on 2 cores: pack before the first call.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WHEELS=.whl
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | du -cb --files0-from=- | tail -1 | cut -f1)
part=$(( 62 * 1024 * 1024 - tree ))  # a call carries the tree and one part
rm -rf .gl  # a part left by an earlier pack would be joined to this one's
mkdir -p "$WHEELS" .gl/stage
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --no-deps -d "$WHEELS" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
    apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1 ray==2.60.0 lmdb==3.0.0 starlette==1.10.0 uvicorn==0.54.0 httptools h11 \
    xgboost-cpu tornado jsonschema jsonschema-specifications referencing rpds-py attrs sniffio cuda-bindings==13.5.0 cuda-pathfinder
"$PY" -m pip wheel -q --no-deps -w "$WHEELS" .
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
here=$PWD
stage=$here/.gl/stage
(cd "$work" && unzip -q "$here/$WHEELS"/apache_tvm-0.27.0.post1-*.whl && rm -rf tvm/3rdparty tvm/src tvm/web tvm/include \
    && tar cf - tvm apache_tvm-0.27.0.post1.dist-info | xz -9 -T2 > "$stage/tvm.tar.xz")
(cd "$work" && rm -rf tvm apache_tvm-* && unzip -q "$here/$WHEELS"/ray-2.60.0-*.whl \
    && rm -rf ray/jars ray/rllib ray/llm ray/data ray/serve ray/tune ray/train ray/air ray/dashboard/client \
    && strip --strip-unneeded ray/_raylet.so ray/core/src/ray/raylet/raylet ray/core/src/ray/gcs/gcs_server \
    && tar cf - ray ray-2.60.0.dist-info | xz -9 -T2 > "$stage/ray.tar.xz")
for w in apache_tvm_ffi attrs cuda_bindings cuda_pathfinder h11 httptools jsonschema-4 jsonschema_specifications lmdb referencing rpds_py \
         sniffio starlette tornado uvicorn xgboost_cpu schedhub; do
    cp "$WHEELS"/"$w"*.whl "$stage"/
done
pack=$(date -u +%Y%m%d%H%M%S)  # names this pack's parts, so that no part of another pack is joined to them
(cd "$stage" && tar cf - ./*) | split -b "$part" -d -a 2 --numeric-suffixes=1 - .gl/part
rm -rf "$stage"
count=$(ls .gl/part* | wc -l)
for f in .gl/part*; do
    n=${f#.gl/part}
    mkdir .gl/"$n" && mv "$f" .gl/"$n"/"pack-$pack-$n-of-$(printf %02d "$count")"
done
fits=0
for n in $(seq -f %02g 1 "$count"); do
    carried=$(( tree + $(du -sb .gl/"$n" | cut -f1) ))
    verb=unpack; [ "$n" = "$(printf %02d "$count")" ] && verb="run SECONDS"
    echo "call $n: bash bench/gpu_session.sh $verb   carry [\".gl/$n\"]   $(awk -v b="$carried" 'BEGIN { printf "%.1f", b / 1048576 }') MiB of 64"
    [ "$carried" -le $(( 64 * 1024 * 1024 )) ] || { echo "call $n is over the 64 MiB a call carries" >&2; fits=1; }
done
exit "$fits"
