#!/usr/bin/env bash
# The next GPU blocks as planned, through run_block.sh, so that a session lent a
# machine starts one in one call (a run's command line is limited to 2,000
# characters):
#   . test/gpu/device_setup.sh && { GRAPHFIX_COMMIT=<sha> RES=/tmp/res \
#     setsid nohup bash test/gpu/next_block.sh [mamba2|qwen3-next|qwen3.5] \
#     >/tmp/block.log 2>&1 </dev/null & }
# then only polling calls, back to back: RES=/tmp/res bash test/gpu/poll_block.sh 240
# Each block is about 25 min of a 30-min device budget with the bundle and set-up
# on a fresh machine, qwen3.5's (a PRE and five servers) likely more, not timed
# whole: one block a session, BLOCK_STEPS=N for less. Bundles: mamba2 serves on FlashInfer
# (a NOFA3=1 re-split will do), qwen3-next on fa3 and stops at once without it
# (docs/next_gpu_blocks.md).
#
# mamba2 (the default; issue 16, docs/next_gpu_blocks.md):
#  (No PRE since 2026-12-07: the snapshot kernel's GPU tests and the no-buffer
#     NemotronH engine's graph vs eager passed that day,
#     benchmark/results/gpu/serving_2026-12-07b/pre/.)
#  1. Nemotron-H-8B's dimensions as shipped (graphs over one request slot for
#     token buckets 576-1536 since 2026-12-07, MAMBA2_SINGLE_REQUEST_GRAPH_MAX_
#     TOKENS; longer prompts routed eager), full and breakable (eager on this
#     model), one prompt of 512-3072 tokens and four of 512 or 1024, profiled
#     at 1024 and 1536 tokens; its log must show no Triton kernel compiled or
#     first loaded after start (POST: full_late_compiles.txt; every late compile
#     and load is logged: SGLANG_TRITON_SLOW_COMPILE_THRESHOLD_SECS,
#     SGLANG_TRITON_LOAD_WARNING_THRESHOLD_GB).
#  2. The control: the same full server without the one-slot graphs (the test
#     probe's switch), profiled at the same sizes; POST diffs its kernels
#     against step 1's full server (one_slot_vs_16_kernels.txt).
#  3. Step 1's full server with the snapshot kernel (the test probe's switch),
#     profiled at the same sizes.
#  4. Granite-4.0-H-Micro's layout, full and breakable, bursts and long prompts,
#     profiled at 1 x 16 and 8 x 64 tokens (the host time before each replay).
#
# qwen3-next (issue 13; docs/next_gpu_blocks.md says what each block answers):
#  1. Qwen3-Next-80B-A3B's dimensions (FP8), breakable, full and disabled servers
#     at sglang's default chunking, chat-like traffic at four request rates (up
#     to all at once), bursts and long prompts (--quick), each server's
#     8k-16k and 4 x 256 runs profiled: disabled measured beside the other two, and
#     what the full server spends where breakable's come sooner (with FlashInfer
#     attention full lost both, 2026-12-05); with the test probe, for its split of
#     each prefill graph's memory and the tensors they keep (issue 13's memory
#     goal; it also counts the full graph's replays, a file append each).
#  2. The same model at --chunked-prefill-size 512, breakable and full, bursts:
#     issue 13's "8 x 64 tokens at least as fast as breakable" at its settings.
#  POST: then, if the block's time allows, a tiny Kimi-Linear engine at chunked
#     prefill 512: the request-slot floor's cached-prefix chunks keep a 2000-token
#     prompt's every chunk on the graph, its outputs equal to eager.
#
# qwen3.5 (issue 13 on an H100, which sessions get far more often than an H200):
#  PRE: the captured extend's GPU cases of steps 2-4's switches
#     (test_gdn_extend_kernel.py -k "1slot or track_kernel or shared_tables");
#  1. the qwen3-next block's first serving step on Qwen3.5-35B-A3B's text model
#     (FP8, about 36 GB of weights; served once, 2026-12-07d: full 10-13 % slower
#     than breakable for one long prompt), as shipped since (the reach-only
#     zeroing past the batch), breakable and full only;
#  2. the full server with a graph over one request slot per token bucket above
#     512 (the test probe's GRAPHFIX_PROBE_GDN_SINGLE_REQUEST_GRAPHS=1: FlashInfer's
#     context-parallel GDN prefill for one prompt, as eager runs it), bursts and
#     long prompts, profiled as step 1; POST diffs its kernels against step 1's
#     full server (slots_16_vs_one_slot_kernels.txt);
#  3. step 1's full server with the index tables the GDN layers derive built
#     once a forward (the test probe's GRAPHFIX_PROBE_GDN_TABLES_ONCE_PER_FORWARD=1:
#     31 small device ops a layer fewer), the same runs profiled; POST diffs
#     its kernels against step 1's full server (per_layer_vs_once_kernels.txt);
#  4. step 1's full server with the prefix-cache snapshot in one kernel launch
#     a layer (GRAPHFIX_PROBE_GDN_TRACK_SNAPSHOT_KERNEL=1: no gather of every
#     request slot's state first), likewise (track_gather_vs_kernel_kernels.txt);
#  5. the disabled server, step 1's runs (last: the switches need breakable
#     and full only), diffed against step 1's (full_vs_disabled_kernels.txt,
#     breakable_vs_disabled_kernels.txt);
#  then (POST) a tiny Qwen3.5 MoE engine's full graph vs
#  eager on the same kernels and its wrong-state control
#  (test_hybrid_full_prefill_graph.py -k qwen3_5_moe; 7 min on 2026-12-07c, where
#  the graph equalled eager and the control stayed inside the old 0.05 on one
#  batch: again at 0.02). Same fa3 bundle; no Kimi-Linear POST.
#
# BLOCK_STEPS=N runs only the first N serving steps (then POST), for a session
# left with less device time than a whole block (each start that got no machine
# cost 1-2 min on 2026-12-06): the steps are in the order that matters.
#
# POST, every block: each served report's traces summarised (trace_summary.py;
# run_block.sh already did, right after each serving run) and the servers diffed
# (profile_diff.py: device ops, and the CUDA runtime's calls) into RES/post, on
# the device (the traces may be too large to come back).
set -u
cd "$(dirname "$0")/../.."
if [ $# -gt 1 ]; then
  echo "next_block.sh: one block name at most (mamba2, qwen3-next, qwen3.5), got: $*" >&2
  exit 2
fi
block=${1:-mamba2}
if [ -n "${BLOCK_STEPS:-}" ] && ! [[ $BLOCK_STEPS =~ ^[1-9][0-9]*$ ]]; then
  echo "next_block.sh: BLOCK_STEPS takes a whole number of serving steps (1, 2, ...), got '$BLOCK_STEPS'" >&2
  exit 2
fi
mkdir -p /tmp/probe
# The test probe, with its split of the prefill graphs' memory into the caching
# allocator's pool and the rest (GRAPHFIX_PROBE_GRAPH_MEMORY) in the server logs.
probe="PYTHONPATH=$PWD/test/gpu/probe:${PYTHONPATH:-} GRAPHFIX_PROBE_DIR=/tmp/probe GRAPHFIX_PROBE_GRAPH_MEMORY=1"
POST='
res=${RES:-/tmp/res}
for run in serving serving_2 serving_3 serving_4; do
  # run_block.sh summarised every report with profiled runs right after its run
  # (its .err says when it could not: not tried again); a report without
  # profiled runs has no traces to diff.
  [ -s "$OUT/${run}_profile.json" ] || continue
  for pair in "full breakable" "full disabled" "breakable disabled"; do
    set -- $pair
    for ops in kernels host_runtime; do
      python3 benchmark/profile_diff.py "$OUT/${run}_profile.json" --a "$1" --b "$2" \
        --ops "$ops" >"$OUT/${run}_${1}_vs_${2}_${ops}.txt" 2>&1 || true
    done
  done
done'
# POST's lines: one summary of step 1's report and those of the later steps
# named (RUN...) whose traces summarised (steps cut short or whose traces did
# not parse are left out), bounded and kept only when whole, into
# $OUT/NAME_profile.json; trace_summary.py names a later report's server of a
# mode already seen "MODE (RUN)".
steps_summary() {
  local name=$1 run runs=
  shift
  for run in "$@"; do runs+=" $run"; done
  printf '%s' "
both=\"\$OUT/${name}_profile.json\"
reports=
for run in$runs; do
  [ -s \"\$OUT/\${run}_profile.json\" ] && reports=\"\$reports \$res/\$run/serving_prefill_graph.json\"
done
[ -s \"\$OUT/serving_profile.json\" ] && [ -n \"\$reports\" ] \\
  && timeout 600 python3 benchmark/trace_summary.py \$res/serving/serving_prefill_graph.json \$reports \\
    >\"\$both.partial\" \\
  && mv \"\$both.partial\" \"\$both\"
rm -f \"\$both.partial\""
}
# POST's line: server A's kernels against server B's in NAME's summary
# (steps_summary), into $OUT/OUT_kernels.txt.
steps_diff() {
  printf '%s' "
[ -s \"\$OUT/$1_profile.json\" ] && python3 benchmark/profile_diff.py \"\$OUT/$1_profile.json\" \\
  --a '$3' --b '$4' --ops kernels >\"\$OUT/$2_kernels.txt\" 2>&1"
}
case $block in
  mamba2)
    # Step 1's full server (one-slot graphs, as shipped) against step 2's
    # (without them).
    export POST="$POST$(steps_summary one_slot_vs_16 serving_2)$(steps_diff one_slot_vs_16 one_slot_vs_16 full 'full (serving_2)')
# Triton kernels the full servers compiled, or first loaded onto the GPU, after
# start-up (sglang's load watch: a compile is logged only where it missed
# Triton's disk cache, which an earlier run may have filled, and took a second or
# more; step 1's servers log every late compile and every late load, their
# thresholds of compile time and free memory set to 0 s and above any card's).
grep -h -e 'to compile after serving started' -e 'device-loaded after serving started' \
  \$res/serving*/logs/server_full.log \
  >\"\$OUT/full_late_compiles.txt\" 2>/dev/null || true"
    steps=(
      "$probe SGLANG_TRITON_LOAD_WARNING_THRESHOLD_GB=1000000 SGLANG_TRITON_SLOW_COMPILE_THRESHOLD_SECS=0 --model nemotron-h-8b --context-length 8192 --modes full,breakable --workloads sizes --profile 1_x_1024_tokens,1_x_1536_tokens"
      "$probe GRAPHFIX_PROBE_MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS=0 --model nemotron-h-8b --context-length 8192 --modes full --workloads sizes --profile 1_x_1024_tokens,1_x_1536_tokens"
      "$probe GRAPHFIX_PROBE_MAMBA2_SNAPSHOT_KERNEL=1 --model nemotron-h-8b --context-length 8192 --modes full --workloads sizes --profile 1_x_1024_tokens,1_x_1536_tokens"
      "--model granite-4.0-h-micro --modes full,breakable --workloads burst,long --profile 1_x_16_tokens,8_x_64_tokens"
    )
    ;;
  qwen3-next | qwen3.5)
    # sglang's Hopper default attention backend, which these servers keep, is
    # FlashAttention-3: a bundle re-split with NOFA3=1 has none, and every server
    # would die at start-up (2026-12-05). The block runs in the background: the
    # reason goes where poll_block.sh reads (RES/progress.log), and RES/DONE ends it.
    if ! fa3=$(python3 -c "from sgl_kernel import flash_ops" 2>&1); then
      res=${RES:-/tmp/res}
      mkdir -p "$res"
      echo "$(date -u +%H:%M:%S) next_block.sh: $block serves on fa3 (sglang's" \
        "default on Hopper), and this site's sgl_kernel does not import FlashAttention-3" \
        "(${fa3##*$'\n'}): carry a bundle re-split without NOFA3=1" \
        "(test/gpu/resplit_bundle.sh)" | tee -a "$res/progress.log" >&2
      touch "$res/DONE"
      exit 3
    fi
    model=qwen3-next-80b-a3b-fp8
    second="--model $model --modes breakable,full --workloads burst --quick -- --chunked-prefill-size 512"
    third=()
    first_modes=breakable,full,disabled
    if [ "$block" = qwen3.5 ]; then
      # After the servers: one summary of every step's report, and step 1's
      # full server (16 request slots) against step 2's
      # (GDN_SINGLE_REQUEST_GRAPHS: a graph over one slot for one long prompt),
      # step 3's (GDN_TABLES_ONCE_PER_FORWARD) and step 4's
      # (GDN_TRACK_SNAPSHOT_KERNEL), and step 1's servers against step 5's
      # disabled one; then a tiny Qwen3.5 MoE engine's graph vs eager on the
      # same kernels, with the wrong-state control (7 min on 2026-12-07c).
      model=qwen3.5-35b-a3b-fp8
      later="--model $model --modes full --workloads burst,long --quick --profile long_8k-16k,4_x_256_tokens"
      second="$probe GRAPHFIX_PROBE_GDN_SINGLE_REQUEST_GRAPHS=1 $later"
      third=(
        "$probe GRAPHFIX_PROBE_GDN_TABLES_ONCE_PER_FORWARD=1 $later"
        "$probe GRAPHFIX_PROBE_GDN_TRACK_SNAPSHOT_KERNEL=1 $later"
      )
      # Disabled last (lost to the machine on 2026-12-07d): the switches'
      # comparisons need breakable and full only, so a cut block keeps them.
      first_modes=breakable,full
      third+=("$probe --model $model --modes disabled --workloads chat,burst,long --quick --profile long_8k-16k,4_x_256_tokens")
      # First (PRE): the captured extend's GPU cases the switches wait for, so
      # that a block cut short still has them (not timed: 16 cases of that file
      # took 93 s on an H100, 2026-12-07d; these are 22).
      export PRE="timeout 300 python3 -m pytest test/gpu/test_gdn_extend_kernel.py \
-k '1slot or track_kernel or shared_tables' -q -rA -p no:cacheprovider \
>\"\$OUT/gdn_extend_kernel.log\" 2>&1"
      export POST="$POST$(steps_summary steps serving_2 serving_3 serving_4 serving_5)$(
        steps_diff steps slots_16_vs_one_slot full 'full (serving_2)')$(
        steps_diff steps per_layer_vs_once full 'full (serving_3)')$(
        steps_diff steps track_gather_vs_kernel full 'full (serving_4)')$(
        steps_diff steps full_vs_disabled full disabled)$(
        steps_diff steps breakable_vs_disabled breakable disabled)
timeout 600 python3 -m pytest test/gpu/test_hybrid_full_prefill_graph.py -k qwen3_5_moe \
  -q -rA -p no:cacheprovider >\"\$OUT/qwen3_5_moe_engine.log\" 2>&1"
    else
      export POST="$POST
timeout 300 python3 -m pytest test/gpu/test_kimi_linear_full_prefill_graph.py -k slot_floor \
  -q -rA -p no:cacheprovider >\"\$OUT/kimi_linear_slot_floor.log\" 2>&1"
    fi
    steps=(
      "$probe --model $model --modes $first_modes --workloads chat,burst,long --quick --profile long_8k-16k,4_x_256_tokens"
      "$second"
      "${third[@]}"
    )
    ;;
  *)
    echo "next_block.sh: no block named '$block' (mamba2, qwen3-next, qwen3.5)" >&2
    exit 2
    ;;
esac
exec bash test/gpu/run_block.sh "" "" "${steps[@]:0:${BLOCK_STEPS:-${#steps[@]}}}"
