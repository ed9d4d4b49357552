#!/usr/bin/env bash
# Re-split the offline GPU bundle into smaller parts, so that one part plus this
# working tree stays under the device tool's 64 MiB per call (the bundle's 60 MB
# parts overflowed beside a tree of ~12 MB on 2026-12-03, and so did 56 MB ones;
# the tree reached 20.7 MB on 2026-12-07 and is 6.5 MB with its results' logs
# gzipped, benchmark/compact_results.sh; test/unit/test_repo_size.py holds it
# to this part size plus 8 MiB under the limit). Build the bundle
# with `KEEP_FA3=1 bash ../shared/gpu/bundle.sh .gpu-bundle
# sgl-deep-gemm==0.2.3.post2 sgl-flash-mla==1.0.0 datasets==5.2.0` (datasets, an
# sglang requirement the shared list leaves out, for sglang.benchmark.serving).
# assemble.sh and device_setup.sh read it unchanged from /tmp/gpu-bundle/NN/part.
#   bash test/gpu/resplit_bundle.sh .gpu-bundle .gpu-bundle2 [PART_BYTES]
# NOFA3=1 also drops sglang-kernel's FlashAttention-3 library (1.1 GB unpacked,
# most of the bundle's sglang_kernel_hopper.zip) from a KEEP_FA3=1 bundle: 25
# parts of 45 MB instead of 33, for blocks whose engines run
# --attention-backend flashinfer (every Mamba2 case; GDN cases that leave sglang's
# Hopper default, fa3, need it). The archive and its checksum then change.
# DEST must be git-ignored (.gitignore has .gpu-bundle*/). Then one run per
# part: carry [DEST/NN], command `mkdir -p /tmp/gpu-bundle && cp -r DEST/NN /tmp/gpu-bundle/`.
set -euo pipefail
src=${1:?usage: resplit_bundle.sh SRC DEST [PART_BYTES]} dest=${2:?}
bytes=${3:-45000000}
source "$src/00/MANIFEST"
join() { for i in $(seq 0 $((parts - 1))); do cat "$src/$(printf '%02d' "$i")/part"; done; }
rm -rf "$dest" && mkdir -p "$dest"
if [ "${NOFA3:-0}" = 1 ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/w" "$work/sk"
  join | tar xf - -C "$work/w"
  python3 -m zipfile -e "$work/w/sglang_kernel_hopper.zip" "$work/sk"
  fa3="$work/sk/sgl_kernel/flash_ops.abi3.so"
  [ -f "$fa3" ] || { echo "resplit_bundle: no $fa3 in the bundle (KEEP_FA3=1?)" >&2; exit 1; }
  rm "$fa3" "$work/w/sglang_kernel_hopper.zip"
  (cd "$work/sk" && python3 -m zipfile -c "$work/w/sglang_kernel_hopper.zip" .)
  (cd "$work/w" && tar cf "$work/b.tar" -- *)
  sha256=$(sha256sum "$work/b.tar" | cut -d' ' -f1)
  split -b "$bytes" -d -a 2 "$work/b.tar" "$dest/.part."
else
  join | split -b "$bytes" -d -a 2 - "$dest/.part."
fi
n=0
for p in "$dest"/.part.*; do
  d=$(printf '%02d' $n)
  mkdir -p "$dest/$d" && mv "$p" "$dest/$d/part"
  n=$((n + 1))
done
cp "$src/00/assemble.sh" "$dest/00/"
printf 'parts=%s\nsha256=%s\n' "$n" "$sha256" >"$dest/00/MANIFEST"
echo "resplit_bundle: $n parts of at most $bytes bytes in $dest"
