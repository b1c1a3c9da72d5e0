#!/usr/bin/env bash
# Builds here, on a machine with the CUDA toolkit and no GPU, the programs the GPU programme runs
# (the regen tool and the CUDA suites), and copies them into the git-ignored build-carry/, so a
# device call carries them instead of spending device time on a build. The build targets sm_90,
# generic x86-64 (no -march=native: the device's processor may differ), no MILP (CBC is not
# installed there), no MPI (neither is Open MPI: the NCCL suite runs one rank, which needs none)
# and no Python module (another interpreter there). build-carry/SOURCE_DIR names
# this checkout, whose path is compiled into the programs (test data, tools/plot.py); the
# `prebuilt` phase of scripts/gpu-session.sh links that path to the device's checkout.
# Usage: bash scripts/gpu-prebuild.sh   (then carry ["build-pack"]: the stripped programs, compressed)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .gpu-deps ] || bash scripts/gpu-deps.sh
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DREGEN_CUDA=ON -DREGEN_CUDA_ARCHS=90 \
  -DREGEN_NATIVE=OFF -DREGEN_MILP=OFF -DREGEN_MPI=OFF -DREGEN_PYTHON=OFF -DREGEN_DEPS_DIR="$PWD/.gpu-deps" > /dev/null
suites=$(cd tests/cuda && ls test_*.cpp | sed 's/\.cpp$//')
# shellcheck disable=SC2086
cmake --build build-gpu -j "$(nproc)" --target regen $suites
rm -rf build-carry
mkdir -p build-carry/tests
cp build-gpu/regen build-carry/
for t in $suites; do cp "build-gpu/tests/$t" build-carry/tests/; done
echo "$PWD" > build-carry/SOURCE_DIR
git rev-parse HEAD > build-carry/COMMIT
git diff --quiet HEAD || echo "dirty" >> build-carry/COMMIT
# The programs unstripped are about 64 MiB, the device tool's whole limit for a call: carry them
# stripped and compressed (about 12.5 MiB), unpacked by the session's prebuilt phase.
rm -rf build-pack && mkdir -p build-pack/build-carry
cp -r build-carry/. build-pack/build-carry/
strip build-pack/build-carry/regen build-pack/build-carry/tests/*
tar -C build-pack -cJf build-pack/build-carry.tar.xz build-carry && rm -rf build-pack/build-carry
echo "gpu-prebuild: build-carry ($(du -sh build-carry | cut -f1)), packed in build-pack/build-carry.tar.xz" \
  "($(du -sh build-pack/build-carry.tar.xz | cut -f1)) from $(head -1 build-carry/COMMIT): carry [\"build-pack\"]"
