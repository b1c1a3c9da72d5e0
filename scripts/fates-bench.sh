#!/usr/bin/env bash
# Usage: bash scripts/fates-bench.sh [build]   (logs and plans in OUT, default out/fates; about 10 minutes
# on 2 CPU cores, most of it profiling ResNet-152 at batch 32)
# docs/results.md, "Every fate": dp with and without every fate on ResNet-152 b32 224 (reserved budgets of its
# no-remat peak), ResNet-152 b8 224 (lowest budgets), the Transformer b32 (50% allocated), under
# the GPU-like transfer model (step:0.4) and this machine's measured one (profile).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
B=$BUILD
OUT=${OUT:-out/fates}
mkdir -p $OUT
echo "start $(date -u) $(uptime)"
prof() { # name flags...
  local n=$1; shift
  [ -f $OUT/$n/profile.json ] || $B/regen profile "$@" --warmup 1 --iterations 1 --out $OUT/$n > $OUT/$n.profile.log 2>&1
  echo "profiled $n $(date -u) $(uptime)"
}
plan() { # name tag flags...
  local n=$1 t=$2; shift 2
  $B/regen plan --profile $OUT/$n/profile.json --out $OUT/$n/$t.json --decisions $OUT/$n/$t.csv "$@" > $OUT/$n/$t.log 2>&1
  echo "== $n $t: $*"; grep -E "predicted|overhead|offload|optimizer state|host|lowest|cannot|error" $OUT/$n/$t.log | head -12
}
prof r152b8 --model resnet152 --batch 8 --threads 2
for t in "step:0.4" profile; do
  tt=${t//:/}
  plan r152b8 dp-lowest-$tt --policy dp --budget lowest --transfer $t
  plan r152b8 dpall-lowest-$tt --policy dp --budget lowest --offload all --transfer $t
done
prof tb32 --model transformer --batch 32 --threads 2
for t in "step:0.4" profile; do
  tt=${t//:/}
  plan tb32 dp-50a-$tt --policy dp --budget 50% --budget-of allocated --transfer $t
  plan tb32 dpall-50a-$tt --policy dp --budget 50% --budget-of allocated --offload all --transfer $t
  plan tb32 dpall-lowest-$tt --policy dp --budget lowest --budget-of allocated --offload all --transfer $t
done
prof r152b32 --model resnet152 --batch 32 --threads 2
for t in "step:0.4" profile; do
  tt=${t//:/}
  for b in 50% 40% 33% 25% 15% lowest; do
    bb=${b//%/}
    plan r152b32 dp-$bb-$tt --policy dp --budget $b --layout planned --transfer $t
    plan r152b32 dpall-$bb-$tt --policy dp --budget $b --layout planned --offload all --transfer $t
  done
done
echo "end $(date -u) $(uptime)"
