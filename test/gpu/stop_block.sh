#!/usr/bin/env bash
# Stop a block started by run_block.sh and everything it started (run as its own
# command: a pattern in the calling command line would match that shell too).
for pattern in run_block run_suite serving_prefill_graph pytest launch_server; do
  pkill -f "$pattern"
done
sleep 2
pgrep -af python3 || echo "stop_block: no python3 left"
