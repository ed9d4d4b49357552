#!/usr/bin/env bash
# On the device machine, after a block: hand the JIT caches (sglang's own under
# ~/.cache/sglang, where sglang 0.5.23 points Triton and its JIT kernels;
# Triton's, FlashInfer's and CuTe DSL's defaults) back through $OUT, 8 files of 8 MiB
# per call (what comes back: 8 files, 64 MiB together), so that the
# next session's first engines skip their compiles (test/gpu/cache_in.sh). Call it
# with 0, 1, 2, ... until it prints "cache_out: last slice" (parts of slice K:
# 8K to 8K+7). Never commit the parts; they go under .jitcache/ (git-ignored):
#   bash test/gpu/cache_pack.sh /work/.device/NN ...   (on the development machine)
set -eu
slice=${1:-0}
parts=/tmp/jitcache-parts
if [ ! -d "$parts" ]; then
  mkdir -p "$parts"
  dirs=()
  for d in "$HOME/.cache/sglang" "$HOME/.triton/cache" "$HOME/.cache/flashinfer" \
    "${TMPDIR:-/tmp}/$(id -un)/cutlass_python_cache"; do
    [ -d "$d" ] && dirs+=("${d#/}")
  done
  tar -czf - -C / "${dirs[@]}" | split -b 8M -d -a 3 - "$parts/jitcache.tgz."
fi
all=("$parts"/jitcache.tgz.*)
echo "cache_out: ${#all[@]} parts of 8 MiB ($(du -sh "$parts" | cut -f1))"
mkdir -p "$OUT"
for part in "${all[@]:$((slice * 8)):8}"; do cp "$part" "$OUT/"; done
[ $(((slice + 1) * 8)) -ge ${#all[@]} ] && echo "cache_out: last slice"
true
