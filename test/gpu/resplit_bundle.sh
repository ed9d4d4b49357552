#!/usr/bin/env bash
# Re-split the offline GPU bundle (../shared/gpu/bundle.sh: parts of 60 MB) into
# smaller parts, so that one part plus this working tree stays under the device
# tool's 64 MiB per call (the tracked tree alone is ~9 MB, and 60 MB parts then
# overflow). Same archive, same checksum; assemble.sh and device_setup.sh read
# it unchanged from /tmp/gpu-bundle/NN/part.
#   bash test/gpu/resplit_bundle.sh .gpu-bundle .gpu-bundle2 [PART_BYTES]
# DEST must be git-ignored (.gitignore has .gpu-bundle*/). Then one run per
# part: carry [DEST/NN], command `mkdir -p /tmp/gpu-bundle && cp -r DEST/NN /tmp/gpu-bundle/`.
set -euo pipefail
src=${1:?usage: resplit_bundle.sh SRC DEST [PART_BYTES]} dest=${2:?} bytes=${3:-50000000}
source "$src/00/MANIFEST"
rm -rf "$dest" && mkdir -p "$dest"
for i in $(seq 0 $((parts - 1))); do cat "$src/$(printf '%02d' "$i")/part"; done \
  | split -b "$bytes" -d -a 2 - "$dest/.part."
n=0
for p in "$dest"/.part.*; do
  d=$(printf '%02d' $n)
  mkdir -p "$dest/$d" && mv "$p" "$dest/$d/part"
  n=$((n + 1))
done
cp "$src/00/assemble.sh" "$dest/00/"
printf 'parts=%s\nsha256=%s\n' "$n" "$sha256" >"$dest/00/MANIFEST"
echo "resplit_bundle: $n parts of at most $bytes bytes in $dest"
