#!/usr/bin/env bash
# On the device machine, after the .jitcache/NN folders were copied to /tmp/jitcache
# (test/gpu/cache_pack.sh): unpack the caches where Triton, FlashInfer and CuTe
# DSL look for them. A missing part makes tar fail: the engines then compile as
# on a fresh machine.
set -eu
cat $(ls /tmp/jitcache/jitcache.tgz.* | sort) | tar -xzf - -C /
echo "cache_in: $(du -sh "$HOME/.cache/sglang" "$HOME/.triton/cache" 2>/dev/null | cut -f1 | tr '\n' ' ')of caches"
