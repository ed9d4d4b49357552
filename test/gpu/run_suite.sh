#!/usr/bin/env bash
# Run GPU test modules side by side on one H200 (every engine caps its pools), then
# pack their logs and JSON results into $OUT/suite.tgz.
#   OUT=/tmp/out bash test/gpu/run_suite.sh test/gpu/test_a.py test/gpu/test_b.py
# An argument module.py:EXPR runs that module with pytest -k EXPR (its own log).
set -u
cd "$(dirname "$0")/../.."
out=${OUT:?set OUT}
mkdir -p "$out/json" "$out/logs"
pids=()
for arg in "$@"; do
  module=${arg%%:*} select=${arg#*:}
  name=$(basename "$module" .py)
  kargs=()
  if [ "$select" != "$arg" ]; then  # module.py:EXPR runs pytest -k EXPR
    kargs=(-k "$select")
    name="${name}_$(echo "$select" | tr -c 'A-Za-z0-9_\n' _)"
  fi
  OUT="$out/json" timeout "${SUITE_TIMEOUT:-560}" \
    python3 -m pytest "$module" ${kargs[@]+"${kargs[@]}"} -q -rA -p no:cacheprovider ${PYTEST_ARGS:-} >"$out/logs/$name.log" 2>&1 &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
for log in "$out"/logs/*.log; do echo "== $log"; tail -n 4 "$log"; done
tar -czf "$out/suite.tgz" -C "$out" json logs && rm -rf "$out/json" "$out/logs"
exit $rc
