#!/usr/bin/env bash
# One GPU block on a bare H200, run in the background (setsid nohup) from the
# repository root after `. test/gpu/device_setup.sh` (the offline bundle
# assembled, this package installed into /tmp/sglang-site; stop it with
# test/gpu/stop_block.sh): the named GPU test modules (the first alone,
# the rest side by side), then benchmark/serving_prefill_graph.py once per
# further argument (its flags, after any NAME=value words that set that run's
# environment; one after another, alone on the GPU). Everything
# lands under $RES (default /tmp/res; serving runs in RES/serving, RES/serving_2,
# ...); RES/DONE marks the end. SUITE_TIMEOUT (seconds, default 1200) bounds the
# side-by-side modules. PRE, if set, is a command run first, alone on the GPU
# (OUT=RES/pre; its output in RES/pre.log), e.g. a kernel microbenchmark; POST
# likewise last (OUT=RES/post, RES/post.log), e.g. a profile. PRE_TIMEOUT and
# POST_TIMEOUT bound them (seconds, default 900). A serving run with profiled runs
# is summarised right after it (benchmark/trace_summary.py into
# RES/post/NAME_profile.json, SUMMARY_TIMEOUT seconds at most, default 300).
# RES/gpu_clocks.csv: nvidia-smi's clocks, power, utilisation and clock event
# reasons, every 100 ms;
# RES/triton_autotune: Triton's cached autotuning choices.
#   GRAPHFIX_COMMIT=<sha> RES=/tmp/res bash test/gpu/run_block.sh \
#       "first_module.py" "module_a.py module_b.py" "--quick --modes breakable,full" \
#       "--model falcon-h1-7b --quick"
set -u
cd "$(dirname "$0")/../.."
res=${RES:-/tmp/res}
mkdir -p "$res"
first=$1 side_by_side=$2
shift 2
stamp() { echo "$(date -u +%H:%M:%S) $*" >>"$res/progress.log"; }
# Triton's autotuned configs (sglang's Mamba2 SSD kernels tune on their static
# dimensions only, and Triton caches the choice on disk: the first process to
# meet a key, on this machine or, through a previous session's caches unpacked
# by device_setup.sh, on an earlier one, picks the config every later server
# with that key runs). A fresh tuning prints its choice (servers: into their
# logs); after each step the cached choices, as yet unseen, are copied to
# RES/triton_autotune with their times (which step tuned what). sglang points
# Triton at SGLANG_CACHE_DIR/triton (~/.cache/sglang/triton) once imported.
export TRITON_PRINT_AUTOTUNING=1
res=$(cd "$res" && pwd)
keep_autotune() {
  local cache found=
  for cache in "${TRITON_CACHE_DIR:-}" "${SGLANG_CACHE_DIR:-$HOME/.cache/sglang}/triton" \
    "$HOME/.triton/cache"; do
    [ -n "$cache" ] && [ -d "$cache" ] || continue
    found=1
    mkdir -p "$res/triton_autotune"
    (cd "$cache" && find . -name '*.autotune.json' \
      -exec cp -n --parents --preserve=timestamps {} "$res/triton_autotune/" \;)
  done
  [ -n "$found" ] || stamp "keep_autotune: no Triton cache folder"
}
stamp "start ${GRAPHFIX_COMMIT:-unset}"
# The GPU's clocks, power and why its clocks are held down (the driver's name for
# that field changed: the one it answers), every 100 ms for the whole block: a
# run of 12 one-prompt requests lasts about a second, and timings of servers run
# one after another differ (whether the GPU's state does too).
if command -v nvidia-smi >/dev/null; then
  fields=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu
  for reasons in clocks_event_reasons.active clocks_throttle_reasons.active; do
    if nvidia-smi --query-gpu=$reasons --format=csv >/dev/null 2>&1; then
      fields=$fields,$reasons
      break
    fi
  done
  nvidia-smi --query-gpu=$fields --format=csv -lms 100 >"$res/gpu_clocks.csv" 2>/dev/null &
  clocks=$!
  trap 'kill $clocks 2>/dev/null' EXIT
fi
if [ -n "${PRE:-}" ]; then
  mkdir -p "$res/pre"
  OUT="$res/pre" timeout "${PRE_TIMEOUT:-900}" bash -c "$PRE" >"$res/pre.log" 2>&1
  stamp "pre rc=$?"
  keep_autotune
fi
if [ -n "$first" ]; then
  OUT="$res/first" timeout 900 python3 -m pytest $first -q -rA -p no:cacheprovider \
    >"$res/first.log" 2>&1
  stamp "first rc=$?"
  keep_autotune
fi
if [ -n "$side_by_side" ]; then
  OUT="$res/suite" PYTEST_ARGS=-s SUITE_TIMEOUT=${SUITE_TIMEOUT:-1200} bash test/gpu/run_suite.sh \
    $side_by_side >"$res/suite.out" 2>&1
  stamp "suite rc=$?"
  keep_autotune
fi
n=0
for serving_args in "$@"; do
  n=$((n + 1)) name=serving
  [ $n -gt 1 ] && name=serving_$n
  # Leading NAME=value words are that run's environment (e.g. a probe switch).
  run_env=() flags=() words=()
  read -ra words <<<"$serving_args"
  for word in "${words[@]}"; do
    if [ ${#flags[@]} -eq 0 ] && [[ $word =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then
      run_env+=("$word")
    else
      flags+=("$word")
    fi
  done
  report=$res/$name/serving_prefill_graph.json
  rm -f "$report"  # a RES used before: its report is not this run's
  env SGLANG_ENABLE_JIT_DEEPGEMM=0 OUT="$res/$name" "${run_env[@]}" \
    python3 benchmark/serving_prefill_graph.py "${flags[@]}" >"$res/$name.out" 2>&1
  stamp "$name ($serving_args) rc=$?"
  keep_autotune
  # Its profiled runs summarised now, before the next step (nothing is timed
  # meanwhile): the traces stay on the machine, and a block cut short later
  # still hands this back (2026-12-05: two servers' traces were lost so).
  # Kept only when whole; else its .err stays, and POST does not try again.
  if grep -q '"profiled"' "$report" 2>/dev/null; then
    mkdir -p "$res/post"
    summary=$res/post/${name}_profile
    timeout "${SUMMARY_TIMEOUT:-300}" python3 benchmark/trace_summary.py "$report" \
      >"$summary.partial" 2>"$summary.err"
    rc=$?
    if [ $rc -eq 0 ]; then
      mv "$summary.partial" "$summary.json" && rm -f "$summary.err"
    else
      rm -f "$summary.partial"
    fi
    stamp "$name profile summary rc=$rc"
  fi
done
if [ -n "${POST:-}" ]; then
  mkdir -p "$res/post"
  OUT="$res/post" timeout "${POST_TIMEOUT:-900}" bash -c "$POST" >"$res/post.log" 2>&1
  stamp "post rc=$?"
  keep_autotune
fi
touch "$res/DONE"
