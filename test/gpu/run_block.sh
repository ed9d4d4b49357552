#!/usr/bin/env bash
# One GPU block on a bare H200, run in the background (setsid nohup) from the
# repository root after the offline bundle is assembled and this package is
# installed into /tmp/sglang-site: the named GPU test modules (the first alone,
# the rest side by side), then benchmark/serving_prefill_graph.py. Everything
# lands under $RES (default /tmp/res); RES/DONE marks the end. SUITE_TIMEOUT
# (seconds, default 1200) bounds the side-by-side modules.
#   GRAPHFIX_COMMIT=<sha> RES=/tmp/res bash test/gpu/run_block.sh \
#       "first_module.py" "module_a.py module_b.py" "--quick --modes breakable,full"
set -u
cd "$(dirname "$0")/../.."
res=${RES:-/tmp/res}
mkdir -p "$res"
first=$1 side_by_side=$2 serving_args=$3
stamp() { echo "$(date -u +%H:%M:%S) $*" >>"$res/progress.log"; }
stamp "start ${GRAPHFIX_COMMIT:-unset}"
if [ -n "$first" ]; then
  OUT="$res/first" timeout 900 python3 -m pytest $first -q -rA -p no:cacheprovider \
    >"$res/first.log" 2>&1
  stamp "first rc=$?"
fi
if [ -n "$side_by_side" ]; then
  OUT="$res/suite" PYTEST_ARGS=-s SUITE_TIMEOUT=${SUITE_TIMEOUT:-1200} bash test/gpu/run_suite.sh \
    $side_by_side >"$res/suite.out" 2>&1
  stamp "suite rc=$?"
fi
if [ -n "$serving_args" ]; then
  SGLANG_ENABLE_JIT_DEEPGEMM=0 OUT="$res/serving" \
    python3 benchmark/serving_prefill_graph.py $serving_args >"$res/serving.out" 2>&1
  stamp "serving rc=$?"
fi
touch "$res/DONE"
