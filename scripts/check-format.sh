#!/usr/bin/env bash
# Fails when a tracked C, C++ or CUDA file is not clang-format clean under the checked-in
# .clang-format. The whole tree was formatted in one commit, so "every file" is "every changed
# file" plus a guard against drift. CI runs it first (.ci/run); fix with
#   clang-format -i $(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' '*.c')
# Needs Debian's clang-format 14 (REGEN_WITH_FORMAT=1 bash scripts/install-deps.sh installs it):
# another major version formats some constructs differently.
set -euo pipefail
cd "$(dirname "$0")/.."
REGEN_WITH_FORMAT=1 bash scripts/install-deps.sh
cf="${CLANG_FORMAT:-clang-format}"
if ! command -v "$cf" >/dev/null 2>&1; then
  echo "check-format: $cf not found" >&2
  exit 1
fi
major=$("$cf" --version | sed -n 's/.*version \([0-9]*\).*/\1/p')
if [ "$major" != "14" ]; then
  echo "check-format: $cf is version $major; the tree is formatted with clang-format 14" >&2
  exit 1
fi
bad=()
while IFS= read -r f; do
  if ! "$cf" --dry-run -Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' '*.c' '*.cc' '*.hpp')
if [ "${#bad[@]}" -ne 0 ]; then
  echo "check-format: ${#bad[@]} file(s) not clang-format clean:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "run: clang-format -i ${bad[*]}" >&2
  exit 1
fi
echo "check-format: every tracked C/C++/CUDA file is clang-format clean"
