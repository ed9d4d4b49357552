#!/usr/bin/env bash
# Gzip the server logs and sglang.benchmark.serving's JSONL rows of committed
# results (every *.log and *.jsonl over 16 KiB; gzip -n, so a file compacts to the
# same bytes each time), before they are committed. Every device call carries the
# whole working tree beside one bundle part of 45 MB (test/gpu/resplit_bundle.sh)
# under the device tool's 64 MiB; on 2026-12-07 those files were 16.9 of the
# tree's 20.7 MB, 1.4 MB short of that limit. Read them with zless or
# gzip -dc; `serving_prefill_graph.py --recover` reads either form.
# test/unit/test_repo_size.py fails on a tracked one left as it was.
#   bash benchmark/compact_results.sh [DIR...]   (default: benchmark/results)
set -euo pipefail
cd "$(dirname "$0")/.."
find "${@:-benchmark/results}" -type f \( -name '*.log' -o -name '*.jsonl' \) \
  -size +16k -print -exec gzip -9n {} \;
