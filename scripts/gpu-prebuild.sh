#!/usr/bin/env bash
# Builds here, on a machine with the CUDA toolkit and no GPU, the programs the GPU programme runs
# (the regen tool and the CUDA suites), and copies them into the git-ignored build-carry/, so a
# device call carries them instead of spending device time on a build. The build targets sm_90,
# generic x86-64 (no -march=native: the device's processor may differ), no MILP (CBC is not
# installed there), no MPI (neither is Open MPI: the NCCL suite runs one rank, which needs none)
# and no Python module (another interpreter there). build-carry/SOURCE_DIR names
# this checkout, whose path is compiled into the programs (test data, tools/plot.py); the
# `prebuilt` phase of scripts/gpu-session.sh links that path to the device's checkout.
# Usage: bash scripts/gpu-prebuild.sh   (then carry ["build-carry", ".gpu-deps"])
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
echo "gpu-prebuild: build-carry ($(du -sh build-carry | cut -f1)) from $(head -1 build-carry/COMMIT)"
