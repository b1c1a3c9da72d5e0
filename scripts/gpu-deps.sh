#!/usr/bin/env bash
# Copies the header-only build dependencies (Eigen 3.4, nlohmann/json, CLI11, doctest and doctest's
# CMake scripts) from this machine's Debian packages into .gpu-deps/, for a machine that has none
# of them and no package registry: the GPU machines of the device tool. Carry .gpu-deps there
# (it is git-ignored) and configure with -DREGEN_DEPS_DIR=$PWD/.gpu-deps; scripts/gpu-session.sh
# does that by itself when the folder is there. Usage: bash scripts/gpu-deps.sh [DEST]
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.gpu-deps}"
bash scripts/install-deps.sh
src_eigen=/usr/include/eigen3
for f in "$src_eigen/Eigen/Core" /usr/include/nlohmann/json.hpp /usr/include/CLI/CLI.hpp \
         /usr/include/doctest/doctest.h /usr/lib/cmake/doctest/doctest.cmake \
         /usr/lib/cmake/doctest/doctestAddTests.cmake; do
  [ -f "$f" ] || { echo "gpu-deps: $f is missing (scripts/install-deps.sh should have installed it)" >&2; exit 1; }
done
tmp="$dest.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp/eigen3" "$tmp/include" "$tmp/cmake"
cp -r "$src_eigen/Eigen" "$tmp/eigen3/"
cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/doctest "$tmp/include/"
cp /usr/lib/cmake/doctest/doctest.cmake /usr/lib/cmake/doctest/doctestAddTests.cmake "$tmp/cmake/"
dpkg-query -W -f '${Package} ${Version}\n' libeigen3-dev nlohmann-json3-dev libcli11-dev doctest-dev \
  > "$tmp/VERSIONS"
rm -rf "$dest"
mv "$tmp" "$dest"
echo "gpu-deps: wrote $dest ($(du -sh "$dest" | cut -f1)):"
cat "$dest/VERSIONS"
