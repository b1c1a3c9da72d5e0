#!/usr/bin/env bash
# Runs each libFuzzer harness of tests/fuzz for a bounded time (`make fuzz`; CI runs it):
#   scripts/fuzz.sh BUILD_DIR SECONDS
# Each starts from its checked-in seed corpus (tests/fuzz/corpus/NAME, read only) plus what earlier
# runs in BUILD_DIR found (BUILD_DIR/fuzz/corpus/NAME); a crash, a sanitizer report, an
# exception other than regen::Error, a timeout (10 s per input) or 4 GiB of memory fails the run,
# and the input that did it is kept in BUILD_DIR/fuzz/artifacts/. Prints the executions per harness.
set -euo pipefail
build=${1:?usage: scripts/fuzz.sh BUILD_DIR SECONDS}
seconds=${2:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
export REGEN_FUZZ_PROFILE="$root/tests/fuzz/corpus/fuzz_profile/transformer-tiny.json"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
summary=()
for name in fuzz_profile fuzz_plan fuzz_safetensors fuzz_data; do
  work="$build/fuzz/corpus/$name"
  artifacts="$build/fuzz/artifacts/$name/"
  mkdir -p "$work" "$artifacts"
  log="$build/fuzz/$name.log"
  echo "fuzz: $name for ${seconds} s"
  if "$build/tests/fuzz/$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
       -print_final_stats=1 -artifact_prefix="$artifacts" "$work" "$root/tests/fuzz/corpus/$name" \
       > "$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    summary+=("$name: $runs executions, no finding")
  else
    status=1
    summary+=("$name: FINDING (log $log, input in $artifacts)")
    tail -n 40 "$log"
  fi
done
printf '  %s\n' "${summary[@]}"
exit $status
