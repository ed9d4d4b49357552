#!/usr/bin/env bash
# On the development machine: gather the parts cache_out.sh handed back (the
# folders its calls' files arrived in) into .jitcache/NN/ folders of at most 6
# parts (48 MiB, under the 64 MiB a device call carries). Next session, after
# the bundle, one call per folder in one message:
#   carry [".jitcache/NN"], command: mkdir -p /tmp/jitcache && cp .jitcache/NN/* /tmp/jitcache/
# then, before the block: bash test/gpu/cache_in.sh
set -eu
cd "$(dirname "$0")/../.."
rm -rf .jitcache
n=0
for part in $(find "$@" -name 'jitcache.tgz.*' -printf '%f %p\n' | sort | cut -d' ' -f2); do
  dir=.jitcache/$(printf '%02d' $((n / 6)))
  mkdir -p "$dir" && cp "$part" "$dir/"
  n=$((n + 1))
done
echo "cache_pack: $n parts in $(ls .jitcache | wc -l) folders (.jitcache/00 ...)"
