#!/usr/bin/env bash
# tp_size=2 GPU tests (test_tensor_parallel.py) on a host with two GPUs
# (nvidia-h200-x2), one part per call so that each stays inside a 10-minute command:
#   OUT=/tmp/out bash test/gpu/run_tp.sh gdn|kda|dsa|server
# Writes $OUT/tp_<part>.log (pytest -rA -s), the devices seen, and the tests' JSON.
set -u
cd "$(dirname "$0")/../.."
out=${OUT:?set OUT}
part=${1:?which part: gdn, kda, dsa or server}
case $part in
  gdn | kda | dsa) select=$part ;;
  server) select=launch_server ;;
  *) echo "unknown part $part (gdn, kda, dsa or server)" >&2; exit 2 ;;
esac
mkdir -p "$out"
nvidia-smi -L >"$out/tp_$part.devices" 2>&1
OUT="$out" timeout "${TP_TIMEOUT:-580}" python3 -m pytest test/gpu/test_tensor_parallel.py \
  -k "$select" -q -rA -s -p no:cacheprovider >"$out/tp_$part.log" 2>&1
rc=$?
tail -n 15 "$out/tp_$part.log"
exit $rc
