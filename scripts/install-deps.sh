#!/usr/bin/env bash
# Installs the Debian 12 packages regen builds against, only those that are missing.
# Uses sudo when not root. The CUDA toolkit is optional and never installed here:
# CMake builds the CUDA backend only when it finds nvcc (REGEN_CUDA=AUTO), and the MILP planner
# only when pkg-config finds CBC (coinor-libcbc-dev; REGEN_MILP=AUTO).
set -euo pipefail

packages=(cmake make g++ pkg-config libeigen3-dev doctest-dev nlohmann-json3-dev libcli11-dev
          coinor-libcbc-dev
          # Builds compile through it when present (CMakeLists.txt, REGEN_CCACHE): a fresh clone,
          # the sanitizer build and CI take what an earlier build on the machine compiled.
          ccache
          # Data-parallel training under mpirun (REGEN_MPI=AUTO builds it when MPI is found).
          libopenmpi-dev openmpi-bin
          # The Python module (REGEN_PYTHON=AUTO builds it when these are present) and its tests;
          # sklearn ships the handwritten digits the real-data test trains on
          # (tests/python/test_digits.py).
          python3 python3-dev python3-numpy pybind11-dev python3-pytest python3-sklearn)
# `make fuzz`: clang with libFuzzer and its OpenMP runtime.
if [ "${REGEN_WITH_FUZZ:-0}" = "1" ]; then
  packages+=(clang libclang-rt-14-dev libomp-dev)
fi
# scripts/check-format.sh (CI): the formatter the tree is formatted with.
if [ "${REGEN_WITH_FORMAT:-0}" = "1" ]; then
  packages+=(clang-format)
fi
if [ "${REGEN_WITH_PLOTS:-0}" = "1" ]; then
  packages+=(python3 python3-matplotlib)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "install-deps: need root or sudo to install: ${missing[*]}" >&2
    exit 1
  fi
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
