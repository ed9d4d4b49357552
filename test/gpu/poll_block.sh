#!/usr/bin/env bash
# On the device machine, as its own call while a block (run_block.sh) runs: wait
# up to SECONDS (default 240; back early once the block is done), print its
# progress, and hand back everything it has written so far through $OUT (one
# archive, in 8 MiB parts: at most 8 come back per call), so that a machine
# lost later keeps what this poll saw. Back to back, these calls also keep the
# machine held (it goes back 30 s after a call ends). Locally:
#   cat /work/.device/NN/res.tgz.* | tar -xzf - -C DEST
set -u
secs=${1:-240}
res=${RES:-/tmp/res}
for ((waited = 0; waited < secs; waited += 5)); do
  [ -e "$res/DONE" ] && break
  sleep 5
done
cat "$res/progress.log" 2>/dev/null || echo "poll_block: no $res/progress.log yet"
for out in "$res"/*.out; do
  [ -e "$out" ] && { echo "== $out"; tail -n 2 "$out" | cut -c1-200; }
done
mkdir -p "$OUT"
# Profiler traces last: where the archive runs past what comes back (8 files,
# 64 MiB together: 8 parts of 8 MiB), the cut falls in the traces and every
# report and log before them unpacks.
(cd "$(dirname "$res")" && {
  find "$(basename "$res")" -type f ! -name '*.trace.json*' -print0
  find "$(basename "$res")" -type f -name '*.trace.json*' -print0
} | tar --null -czf - -T - 2>/dev/null) | split -b 8M -d -a 3 - "$OUT/res.tgz."
parts=("$OUT"/res.tgz.*)
[ ${#parts[@]} -le 8 ] || echo "poll_block: ${#parts[@]} parts, only the first 8 come back"
echo "poll_block: $(du -ch "${parts[@]}" | tail -1 | cut -f1) in ${#parts[@]} part(s)"
