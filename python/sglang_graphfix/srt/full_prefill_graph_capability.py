# SPDX-License-Identifier: Apache-2.0
"""The capability model of full prefill CUDA graphs: every condition a full
prefill graph needs, per linear-attention family and per full-attention backend,
in one table.

Two layers ask it the same question on the same conditions:
  * config time (``..arg_groups.cuda_graph_hook``): ``full_prefill_graph_support``
    on the resolved server arguments, before any weights load: an explicit full
    graph that cannot capture is refused, a model default is downgraded;
  * capture time (the prefill runner and the GDN/KDA backends):
    ``require_capturable_full_prefill_graph`` on the live backends, which only
    asserts what config time already decided.

Facts are gathered into ``Settings`` (from the server arguments, or from the live
backends); ``judge`` evaluates the table on them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sglang.srt.configs import (
    FalconMambaConfig,
    GraniteMoeHybridConfig,
    Lfm2Config,
    Lfm2MoeConfig,
    Lfm2VlConfig,
    Mamba2Config,
    MambaConfig,
    NemotronHConfig,
    ZayaConfig,
)
from sglang.srt.configs.hybrid_arch import (
    hybrid_gdn_config,
    hybrid_kda_config,
    hybrid_lightning_config,
    linear_attn_model_spec,
    mamba2_config,
    mambaish_config,
)
from sglang.srt.configs.inkling import InklingMMConfig, InklingModelConfig
from sglang.srt.configs.mamba_utils import mamba2_state_dtype
from sglang.srt.environ import envs
from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend
from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
from sglang.srt.layers.attention.linear.inkling_sconv_backend import (
    InklingShortConvAttnBackend,
)
from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend
from sglang.srt.layers.attention.linear.kernels.gdn_flashinfer import (
    FlashInferGDNKernel,
)
from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
from sglang.srt.layers.attention.linear.kernels.kda_triton import TritonKDAKernel
from sglang.srt.layers.attention.linear.lightning_backend import (
    LightningAttentionBackend,
)
from sglang.srt.layers.attention.linear.short_conv_backend import ShortConvAttnBackend
from sglang.srt.runtime_context import (
    get_exec,
    get_memory,
    get_platform,
    get_schedule,
    get_spec,
)

# KDA (Kimi-Linear, GLM-5.x Next) under a full prefill graph: the extend runs on
# upstream's breakable-graph KDA tables (KDAPrefillGraphMetadata), wired in by
# ..layers.attention.linear.kda_backend. THE switch for KDA: set it to False to
# refuse a full prefill graph on KDA models again.
KDA_FULL_PREFILL_GRAPH = True

# Mamba2 (Falcon-H1, NemotronH of Mamba2 and attention layers; sglang itself
# captures no prefill graph for GraniteMoeHybrid, NemotronH with MLP/MoE layers
# or pure Mamba2, see _LAYER_SCAN) under a full prefill graph: upstream's
# MambaMixer2 extend on static per-bucket metadata
# (..layers.attention.mamba.mamba2_prefill_graph), wired in by
# ..layers.attention.hybrid_linear_attn_backend. THE switch for Mamba2; on since
# an H200 ran docs/mamba2_full_prefill_graph.md's checks
# (benchmark/results/gpu/mamba2/, mamba2_2026-12-01b/): the captured extend
# replayed vs sglang's eager extend on 24 random padded batches, and tiny
# NemotronH "M*M" (extra buffer and no buffer) and Falcon-H1 engines, graph vs
# eager within 0.008, each with a wrong-state control that diverged. Only what
# those runs covered captures (MAMBA2_CHECKED, the --dtype and groups / state
# conditions); False refuses the family as a whole again. ZAYA1's short conv
# and Mamba-1 stay refused; LFM2's has its own switch (LFM2_FULL_PREFILL_GRAPH).
MAMBA2_FULL_PREFILL_GRAPH = True
# NemotronH's MLP and MoE layers and GraniteMoeHybrid's Mamba2 layers hold no
# attention module, so sglang's prefill graph setup turns every prefill graph off
# for those models (_LAYER_SCAN); a full graph runs the model's forward whole and
# looks no layer's module up, so
# ..model_executor.model_runner_components.cuda_graph_setup keeps it for the
# gaps layer_gap counts (NemotronH's MLP layers, Granite's Mamba2 layers).
# Checked on an H200 (benchmark/results/gpu/mamba2_2026-12-02/): tiny NemotronH
# "M-M*-" and GraniteMoeHybrid, graph vs eager on the same kernels over seven
# batches (chunked prefill, radix hits; 104 decode steps each): no token
# mismatch, logprobs within 5.3e-5 (first-token top-20 within 0.004), and a
# wrong-state control that diverged (13 and 15 mismatches). NemotronH's MoE
# layers are not covered yet (layer_gap). False refuses those models
# again, as before. Pure Mamba2 (no attention at all) stays refused either way.
MAMBA2_LAYER_GAPS_CAPTURED = True
# NemotronH's MoE ('E') layers under the same hook: off until an H200 runs the
# GPU case (test/gpu/test_mamba2_full_prefill_graph.py's nemotron_h_moe; its
# first try, 2026-12-03, gave no verdict: its engine logged nothing for its last
# 8 minutes before the suite's timeout, benchmark/results/gpu/suite_2026-12-03c/);
# while off, NemotronH with MoE layers is refused for the layer scan, as before.
NEMOTRON_H_MOE_LAYERS_CAPTURED = False
# LFM2's short-conv layers under the captured extend: sglang's CUDA conv kernel
# (a grid of request rows, lengths read on the device) on per-bucket tables
# (..layers.attention.linear.short_conv_backend). On since the H200 run of the
# GPU case (test/gpu/test_mamba2_full_prefill_graph.py's lfm2, 2026-12-02: tiny
# dense LFM2, graph vs eager on the same kernels with no token mismatch over 104
# steps, logprobs within 0.016, the wrong-state control diverging); False
# refuses LFM2 again, as before. ZAYA1's short-conv extend loops over host-side
# slots and stays refused either way.
LFM2_FULL_PREFILL_GRAPH = True
# Whether a full prefill graph beats sglang's breakable graph on a Mamba2 model
# that sglang's breakable graph runs (Mamba2 layers with attention beside them or
# between them, no layer without an attention module: Falcon-H1). Not so far:
# served at Falcon-H1-7B's dimensions on an H200 (2026-12-02,
# benchmark/results/gpu/serving_2026-12-02c/), full's median time to first token
# was above breakable's at every workload (47.4 vs 22.9 ms for one 16-token
# prompt, 112.7 vs 45.3 ms for 8 x 64 tokens, 540 vs 468 ms at 8k-16k tokens).
# With the K track rows per bucket, profiled in the scheduler (2026-12-03,
# benchmark/results/gpu/mamba2_2026-12-03/): 21.0 vs 23.8 ms for 1 x 16 tokens,
# 37.1 vs 20.3 ms for 8 x 64 (upstream's per-sequence state work over the
# bucket's 16 request slots). Served again with request buckets too (2026-12-03,
# benchmark/results/gpu/serving_2026-12-03c/falcon_h1_7b_request_buckets/):
# still above breakable at every burst (19.4 vs 17.5 ms for one 16-token
# prompt, 53.9 vs 40.5 ms for 8 x 64 tokens; the full server with the test
# probe's replay counters). While False, such a full prefill
# graph runs as breakable
# (..arg_groups.cuda_graph_hook.route_mamba2_full_prefill_to_breakable).
MAMBA2_FULL_BEATS_BREAKABLE = False
# Request buckets of a Mamba2 full prefill graph. Upstream's MambaMixer2 extend
# does per-sequence work for every request slot a graph was captured with (the
# initial-state gather and select, _chunk_state_varlen, one logical chunk per
# sequence in the chunk scan): at Falcon-H1-7B's dimensions the 16-slot graph's
# GPU time for one 16-token prompt was 15.9 ms against breakable's 8.5, most of
# the difference in those kernels (mamba2_2026-12-03's profile). So
# each token bucket up to REQUEST_BUCKET_MAX_TOKENS also captures a graph per
# request count here below the slots, and a batch of fewer requests replays the
# smallest that holds it (..model_executor.runner.prefill_cuda_graph_runner).
# Each count adds one graph per such bucket to the start-up capture (its time
# not measured alone). On an H200 they match eager on the same kernels at the
# kernel level for 1-8 slots (test_mamba2_extend_graph.py) and in tiny engines
# with one group, the extra buffer and 4 slots (request buckets 1 and 2):
# Falcon-H1, within 0.0033 (tree 963c7ea, benchmark/results/gpu/
# mamba2_2026-12-03b/), NemotronH "M-M*-", within 5.3e-5 (tree 4043cee,
# benchmark/results/gpu/suite_2026-12-03/); and with 8 groups and 12 slots
# (request buckets 1, 2 and 4; greedy logprobs within 0.0078) and
# GraniteMoeHybrid (within 4.6e-5; tree d56e344, benchmark/results/gpu/suite_2026-12-03c/); no_buffer and
# request bucket 8 not yet. Served at Nemotron-H-8B's dimensions
# (benchmark/results/gpu/serving_2026-12-03/), they took the full graph's median
# time to first token from 23.4 to 14.4 ms for one 16-token prompt and from
# 58.5 to 43.7 ms for 4 x 256 tokens (sglang's own prefill there, eager: 46.7
# and 100.5 ms), for 0.26 GB more graph memory (3.34 against 3.08 GB). False:
# one graph over all slots per bucket.
MAMBA2_REQUEST_BUCKETS_CAPTURED = True
MAMBA2_REQUEST_BUCKETS = (1, 2, 4, 8)
REQUEST_BUCKET_MAX_TOKENS = 512
# Token buckets above REQUEST_BUCKET_MAX_TOKENS and up to this many tokens also
# capture a graph over one request slot, for a batch of one long prompt (0:
# none); as the other request buckets, only while MAMBA2_REQUEST_BUCKETS_CAPTURED,
# with more than one request slot and where sglang's capture batch is one request
# (a bucket within the context length), and only up to
# MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST, above which one request's batch runs eager.
# Read in sglang's MambaMixer2 extend and this package's tables
# (docs/next_gpu_blocks.md): one request on a 16-slot graph moves fp32 SSM states
# for every slot and every track row (K = min(slots, tokens // cache chunk), 16
# from 2048 tokens; 4 MiB a state at Nemotron-H-8B's dimensions) and runs
# _chunk_state_varlen over all of them, where eager moves the one request's;
# estimated at 15-21 ms with the smaller per-slot costs, against the 15-18 ms by
# which the graph lost to eager at 2048-3072 tokens
# (benchmark/results/gpu/serving_2026-12-04/). Served once at 4096, on an H100
# with the length bound lifted (benchmark/results/gpu/serving_2026-12-07/): one
# prompt's median time to first token 33.2-91.5 ms at 768-3072 tokens, 11-16 ms
# under the 16-slot graph's on an H200 two days before (across sessions and
# cards, the slower card the one-slot one's), and against breakable's eager in
# the same session 33.2 vs 75.6 ms at 768 tokens, 38.5 vs 62.5 at 1024, 50.2 vs
# 60.5 at 1536 (the 16-slot graph lost 66.6 vs 61.8 there
# on the H200), and 4.8-5.2 ms above it at 2048-3072. A tiny NemotronH engine
# (8 groups, 4 slots, extra buffer) with it equals eager on an H100
# (benchmark/results/gpu/mamba2_2026-12-07/, tree 6d49bc7): single prompts of
# 513-3000 tokens (fresh, on a prefix hit, chunked in two) each replayed the
# one-slot graph, greedy logprobs within 0.0078, and its wrong-state control
# diverged on all 7 batches. 1536: MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST, above which one
# request's batch runs eager anyway. The 16-slot control in the same session as
# the one-slot server has not run (docs/next_gpu_blocks.md). 0: no such graphs.
MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS = 1536


# A GDN full graph on FlashInfer's prefill also captures, for each token bucket
# above REQUEST_BUCKET_MAX_TOKENS, a graph over one request slot, which a batch
# of one request replays (the request buckets' capture, as Mamba2's one-slot
# tier). FlashInfer picks its algorithm from the number of sequences it is
# handed: its context-parallel pipeline below half the SM count in sequences x
# value heads (one or two sequences at Qwen3.5's and Qwen3-Next's 32 heads), its
# plain kernel above; a graph over every request slot hands it all of them, so
# one long prompt ran the plain kernel under the graph and the context-parallel
# one eager. Served at Qwen3.5-35B-A3B's dimensions on an H100
# (benchmark/results/gpu/serving_2026-12-07d/, one prompt of 8k-16k tokens):
# 24.4 ms of plain kernel under the 16-slot graph against 14.3 ms of
# context-parallel pipeline in breakable's eager prefill, the largest part of the
# full graph's 31 ms more device time. Over one slot the captured extend ran the
# context-parallel pipeline and equalled eager exactly on an H100
# (test/gpu/test_gdn_extend_kernel.py's flashinfer_1slot, 4 and 32 value heads;
# benchmark/results/gpu/gdn_extend_2026-12-07d/). Off until a served full graph
# with it (test probe GRAPHFIX_PROBE_GDN_SINGLE_REQUEST_GRAPHS) is not slower than
# without; it adds a graph per bucket above the bound (28 at sglang's default
# buckets up to 8192 tokens). False: one graph per bucket, as before.
GDN_SINGLE_REQUEST_GRAPHS = False


def gdn_request_buckets(
    num_tokens: int, slots: int, context_len: int | None = None
) -> tuple[int, ...]:
    """The request counts for which a GDN full graph's ``num_tokens`` bucket,
    with ``slots`` request slots, also has a graph (GDN_SINGLE_REQUEST_GRAPHS):
    one slot above REQUEST_BUCKET_MAX_TOKENS, where more than one slot is
    captured and sglang's capture batch (requests of at most ``context_len``
    tokens) is one request."""
    if not GDN_SINGLE_REQUEST_GRAPHS or num_tokens <= REQUEST_BUCKET_MAX_TOKENS:
        return ()
    return _holding_the_capture_batch(
        (1,) if slots > 1 else (), num_tokens, context_len
    )


# The captured Mamba2 conv launched over a block table of the batch's (sequence,
# block) rows instead of upstream's grid of R + 1 sequences x the bucket's blocks
# (..layers.attention.mamba.mamba2_prefill_graph's conv_block_table, carried to
# sglang's Triton conv by ..kernels.ops.mamba.causal_conv1d_triton). The grid's
# idle programs grow with slots x bucket: Falcon-H1-7B's profile
# (benchmark/results/gpu/mamba2_2026-12-03/) measured the conv at 0.55 ms under
# full against breakable's 0.07 for 8 x 64 tokens; extrapolated to one long prompt at
# Nemotron-H-8B's dimensions, 3-9.5 ms a forward (docs/mamba2_full_prefill_graph.md).
# The same kernel and table layout run in the GDN and KDA graphs. On an H200
# (benchmark/results/gpu/serving_2026-12-04/, tree 3ecbadc) the captured extend
# with it equals eager (test_mamba2_extend_graph.py, 24 random batches, outputs
# and pools within 1e-4), and a served Nemotron-H-8B-dims full graph (no length
# bound) took 0-2.9 ms off one prompt's median time to first token against the
# same server without it (44.8 to 41.9 ms at 768 tokens, 53.1 to 51.5 at 1024,
# 105.8 to 103.3 at 3072, 176.3 to 175.6 at 4k-8k; four prompts of 1024 at a
# time went from 141.1 to 149.4, in 37 prefill batches instead of 26): less than
# extrapolated, and not the long prompts' gap to breakable. Off until a tiny engine's graph vs
# eager runs with it (test probe GRAPHFIX_PROBE_MAMBA2_CONV_BLOCK_TABLE; that
# block ended before it did).
MAMBA2_CONV_BLOCK_TABLE = False
# A Mamba2 full graph's tables (and snapshot plan) refilled before each replay in
# one Triton launch (sglang_graphfix_kernel.mamba2_prefill_tables) instead of
# about 45 small torch ops, and about 75 more where the bucket has a snapshot
# plan, each a launch on the host (issue 13's host time before a replay). Equal
# to the torch fill in Triton's CPU interpreter over random batches
# (test/unit/sgl_kernel/test_mamba2_prefill_tables.py) and on an H200
# (benchmark/results/gpu/serving_2026-12-05/, tree 47bf142):
# test_mamba2_extend_graph.py -k fill_kernel, 25 passed (the compiled kernel
# against the torch fill; the captured extend with it, and with the conv block
# table, equal to eager over 24 random batches, its launch counted), and a tiny
# NemotronH engine's graph vs
# eager with the test probe's GRAPHFIX_PROBE_MAMBA2_TABLE_FILL_KERNEL (extra
# buffer: every batch replayed, greedy logprobs within 0.0078; that JSON records
# no launch count; the no-buffer engine not run). The host time it saves is not
# measured served. False: the torch fills.
MAMBA2_TABLE_FILL_KERNEL = True
# A Mamba2 full graph's prefix-cache snapshot in one launch a layer
# (sglang_graphfix_kernel.masked_state_rows.snapshot_state_rows) instead of about
# nine torch ops (two index gathers, two compares, two selects over whole states
# and a scatter) over every track row, filler rows included, which also write
# whole states into the padding slot. Profiled at Nemotron-H-8B's dimensions on
# an H100 (benchmark/results/gpu/serving_2026-12-07/, one prompt of 2048 tokens,
# one track row): those ops are most of the graph's 378 device ops more than
# eager's and of the about 1.4 ms of state handling around its 24 Mamba2 layers;
# a K-row bucket moves K times the states (K = 16 from 2048 tokens on 16 slots).
# Equal to the torch snapshot in Triton's CPU interpreter (test/unit/sgl_kernel/
# test_masked_state_rows.py; and the backend's captured extend with it,
# test/unit/srt/layers/attention/mamba/test_mamba2_prefill_graph.py), not yet run
# on a GPU: off until test_mamba2_extend_graph.py -k snapshot_kernel passes and a
# served full graph with it (test probe GRAPHFIX_PROBE_MAMBA2_SNAPSHOT_KERNEL) is
# not slower. False: the torch ops.
MAMBA2_SNAPSHOT_KERNEL = False


def mamba2_request_buckets(
    num_tokens: int, slots: int, context_len: int | None = None
) -> tuple[int, ...]:
    """The request counts for which a Mamba2 full graph's ``num_tokens`` bucket
    also has a graph, with ``slots`` request slots: MAMBA2_REQUEST_BUCKETS below
    both (while MAMBA2_REQUEST_BUCKETS_CAPTURED), for buckets up to
    REQUEST_BUCKET_MAX_TOKENS; one request slot for the larger buckets up to
    MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS (and MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST,
    above which such a batch would not replay it). With ``context_len``, only the
    counts that hold sglang's capture batch, which splits the bucket into
    requests of at most the context length."""
    most = min(slots, num_tokens)
    if not MAMBA2_REQUEST_BUCKETS_CAPTURED:
        return ()
    if num_tokens > REQUEST_BUCKET_MAX_TOKENS:
        largest = MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS
        if MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST is not None:
            largest = min(largest, MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST)
        counts = (1,) if num_tokens <= largest and most > 1 else ()
    else:
        counts = tuple(r for r in sorted(MAMBA2_REQUEST_BUCKETS) if r < most)
    return _holding_the_capture_batch(counts, num_tokens, context_len)


def _holding_the_capture_batch(counts, num_tokens: int, context_len: int | None):
    """The request counts of ``counts`` that hold sglang's capture batch for the
    ``num_tokens`` bucket, which splits it into requests of at most
    ``context_len`` tokens (one request without it)."""
    requests = -(-num_tokens // context_len) if context_len else 1
    return tuple(r for r in counts if r >= requests)


# Where a Mamba2 full prefill graph stops beating the eager prefill that routing
# gives instead: a prefill batch of more new tokens per request, on average, than
# this runs eager instead of replaying
# (..model_executor.runner.prefill_cuda_graph_runner.
# route_long_mamba2_prefills_eager; not under DP attention, whose ranks must
# agree on graph or eager). The full graph runs Mamba2 models only where sglang's
# own prefill is eager (NemotronH with MLP layers, and MoE layers once
# NEMOTRON_H_MOE_LAYERS_CAPTURED; GraniteMoeHybrid; breakable elsewhere:
# MAMBA2_FULL_BEATS_BREAKABLE), so a batch routed eager runs sglang's default
# kernels for it. Served at Nemotron-H-8B's dimensions on an H200, median time to
# first token in ms of 12 prompts (48 for four at a time), servers one after
# another (benchmark/results/gpu/serving_2026-12-04/): full with no bound (graph),
# a second full server with a bound of 512 (the runs above it routed eager) and
# breakable (eager on this model):
#   tokens a prompt     512   768  1024  1536  2048  3072  4 x 512  4 x 1024
#   graph              30.0  44.8  53.1  66.6  81.3 105.8     80.9     141.1
#   routed eager          -  66.0  71.4  80.5  77.9 100.6        -     149.2
#   breakable (eager)  92.9  89.8  87.8  61.8  66.1  87.3    117.3     137.9
# The graph's median first lost to routed eager at 2048 tokens (`python3
# benchmark/serving_prefill_graph.py --crossover <no bound>.json --routed
# <bound 512>.json`), so the bound is 1536. That loss is 3.4 ms on the median
# only (means 81.5 vs 84.7 and p99 82.6 vs 103.6 favour the graph; at 3072 routed
# eager won on both), one server each, within the spread between servers below:
# 1536 against 2048 is not settled. Against breakable's server both lost from 1536
# tokens (and the graph 4 x 1024 by 3.2 ms): that server's eager prefill was 12-19
# ms faster than the full server's at 1536-3072 tokens and 16-24 ms slower at
# 768-1024, with the same kernels and launch flags; profiled side by side on
# 2026-12-05 (benchmark/results/gpu/serving_2026-12-05/) the two servers' eager
# prefill ran the same kernels within 0.3-0.8 ms at 1536-3072 tokens, so that was
# the servers, and the graph's own device time is what is left to profile there
# (the open part of issue 16's "never slower"). Earlier, up to 512 tokens with request
# buckets (serving_2026-12-03/), full's median was below eager's at every bursts'
# and chat workload; its p99 was above eager's at saturation only (853.6 vs 786.3
# ms), which this bound does not address. Applies to every Mamba2 full graph
# (GraniteMoeHybrid's too, not measured at real size). Per request rather than per
# batch: a batch of many short prompts replays. An average: one long prompt among
# short ones replays with them. The runner also runs two eager dummy prefills just
# over it at start-up (under a full graph sglang's own warm-up request replays the
# graph, so nothing else builds the eager Mamba2 kernels before the first routed
# batch; one tensor-parallel rank only; a failure is logged): at a bound of 512 it
# ran with no warning in the served log (whether it spared a compile, that log
# cannot show: an earlier server had filled the machine's Triton cache). None:
# every batch the graph holds replays it. LFM2's short conv is not covered.
MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST: int | None = 1536


def mamba2_graph_routes_long_prefills(largest_bucket: int) -> bool:
    """Whether MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST sends any batch eager that a
    graph of token buckets up to ``largest_bucket`` holds."""
    limit = MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST
    return limit is not None and limit < largest_bucket


def mamba2_graph_takes(num_tokens: int, requests: int) -> bool:
    """Whether a Mamba2 full prefill graph replays a batch of ``num_tokens``
    new tokens over ``requests`` requests as far as its length goes
    (MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST)."""
    limit = MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST
    return limit is None or num_tokens <= limit * max(requests, 1)


# Under a hybrid model's full prefill graph a batch below the smallest bucket
# replays it (..model_executor.runner.prefill_cuda_graph_runner.
# replay_small_batches_in_smallest_bucket) when that bucket has at most this many
# tokens. Chosen, not measured: sglang's default smallest bucket is 4 tokens, and
# the GPU tests capture from 16; a larger smallest bucket keeps sglang's rule.
SMALL_BATCH_REPLAY_MAX_BUCKET = 16
# What the H200 runs above covered: bfloat16 weights, one group (every case, the
# kernel level included) and 8 (NemotronH "M-M*-", GPU case nemotron_h_groups8,
# 2026-12-02: graph vs eager with no token mismatch over 104 steps, logprobs
# within 0.0078, the wrong-state control diverging), float32 SSM and bfloat16
# conv states (sglang's defaults, mamba2_state_dtype), flashinfer attention.
MAMBA2_CHECKED = {
    "dtype": "bfloat16",
    "groups": (1, 8),
    "state": ("float32", "bfloat16"),
    # The Mamba2 engines ran flashinfer; fa3 under a full graph was checked on
    # GDN models only.
    "attention": "flashinfer",
}


@dataclass(frozen=True)
class Settings:
    """The facts a full prefill graph depends on, from the server arguments
    (settings_from_server_args) or from the live backends
    (settings_from_linear_backend)."""

    architecture: str
    family: str | None = None  # LinearFamily.name; None: no linear attention
    linear_prefill_kernel: str | None = None  # GDN/KDA extend kernel
    linear_prefill_kernel_automatic: bool = False  # GDN: sglang's own choice
    fused_accept_verify: bool = False  # KDA's FlashInfer verify stages state
    enable_mis: bool = False
    page_major_kv_layout: bool = False
    kda_graph_extend_disabled: bool = False  # SGLANG_DISABLE_KDA_PREFILL_GRAPH_EXTEND
    attention_backend: str | None = None  # prefill; None: not known here
    mla: bool = False
    sm: int = 0  # compute capability as sglang's platform probe reports it; 0: unknown
    dllm: bool = False
    mamba_mixer: str | None = None  # "mamba2", "mamba1", "short-conv"; None: unknown
    mixed_chunk: bool = False  # --enable-mixed-chunk
    speculative: bool = False  # --speculative-algorithm set
    two_batch_overlap: bool = False  # --enable-two-batch-overlap
    # The layers sglang's prefill-graph setup finds no attention module in (a
    # phrase, LayerGap.layers); None: none, or not known here.
    layer_gap: str | None = None
    # How many layers that gap is, where a full graph runs them
    # (LayerGap.full_graph_layers); None: not such a gap.
    layer_gap_layers: int | None = None
    model_dtype: str | None = None  # the weights' dtype as served; None: unknown
    mamba_groups: int | None = None  # groups of the Mamba2 mixers; None: unknown
    mamba_state_dtypes: tuple[str, str] | None = None  # (SSM, conv); None: unknown


@dataclass(frozen=True)
class Condition:
    """One thing a full prefill graph needs. ``setting`` names what violates it
    as the user sets it (a flag, an environment variable, a switch)."""

    setting: str
    violated: Callable[[Settings], bool]
    reason: Callable[[Settings], str]
    fix: Callable[[Settings], str | None] | None = None  # keeps the full graph


@dataclass(frozen=True)
class LinearFamily:
    """A linear-attention family as sglang builds it (the order of
    attention_registry.attn_backend_wrapper): how its config is recognised, the
    backend classes it runs on, and what its captured extend needs."""

    name: str
    recognises: Callable[[Any], bool]  # on a ModelConfig
    backends: tuple[type, ...]
    captures: bool  # whether a full prefill graph captures its extend at all
    conditions: tuple[Condition, ...] = ()


# THE switch for GDN's FlashInfer prefill inside a full prefill graph: the
# compute capability on which the captured GDN extend runs it (sglang's default
# there) instead of the Triton chunk kernels; None: Triton everywhere. SM90, on an
# H200 (benchmark/results/gpu/gdn_prefill_accuracy_2026-12-01/): the captured
# kernel's output equals sglang's eager FlashInfer extend, except where the
# graph's request slots send FlashInfer to its plain kernel and a batch of few
# sequences sends eager to its context-parallel one (2.4e-4); finite past the
# batch. A hidden-1024 Qwen3-Next engine's first-token logprob equals sglang's
# default eager at 7 of 11 prompt lengths (1-513 tokens) and is within 0.016 at
# the others (top-20: 0.023; at 200 tokens 0.035 from fp32 against the
# default's 0.019). Triton's was 0.06-0.17 closer to fp32 than the default's
# at 4-65 tokens and 0.06-0.07 further at 200 and 513. Blackwell (SM100,
# FlashInfer's state-pool variant) is not validated.
FLASHINFER_GDN_CAPTURE_SM: int | None = 90


# The captured GDN extend, on FlashInfer's prefill, zeroes in place only the conv
# output's rows past the batch that the kernel reads (its 64-token tiles reach
# at most 63 rows past the last sequence; ..layers.attention.linear.
# gdn_prefill_graph.zero_rows_in_kernel_reach) instead of masking the whole
# [tokens, conv dim] output out of place. Served at Qwen3.5-35B-A3B's dimensions
# on an H100 (benchmark/results/gpu/serving_2026-12-07d/, tree 03cf7a4), one
# prompt of 8k-16k tokens in two 8192-token forwards: that masked_fill and the
# copy before it took 9.4 and about 4.1 ms of the 31 ms more device time the full
# graph spent than breakable's eager prefill (its median time to first token
# 255.0 against 225.8 ms). On since the captured extend with it, the conv output
# NaN past the batch, equalled eager on an H100 exactly as the whole-output mask
# does (test/gpu/test_gdn_extend_kernel.py, flashinfer_reach at 4 and 32 value
# heads, 5 batches each, the same differences to the last digit, 0 to 2.4e-4, and
# the wrong-state control detected; benchmark/results/gpu/gdn_extend_2026-12-07d/,
# tree dfff1dc). Its served time is not measured yet. False: the whole-output
# mask.
GDN_FLASHINFER_ZEROES_KERNEL_REACH_ONLY = True
# The captured GDN extend's prefix-cache snapshot of chunk-boundary SSM states in
# one launch a layer of sgl-kernel's snapshot_state_rows, each tracked table row
# reading its own chunk state where the delta rule left it (Triton's per-chunk
# states, FlashInfer's 64-token checkpoints), instead of first gathering one
# state for every table row (an index_select of [request slots, H, V, K]) and
# then copying the tracked ones (sglang's kda_track_ssm_state). The gather moves
# every request slot's state on every replay of a tracking bucket: 32 MiB of
# fp32 a layer at Qwen3.5-35B-A3B's dimensions and 16 slots, whatever the number
# of tracked requests. Profiled served on an H100
# (benchmark/results/gpu/serving_2026-12-07d/, tree 03cf7a4):
# indexSelectSmallIndex<float> took 0.35 ms a prompt of full's 1.6 ms more device
# time than breakable at 4 x 256 tokens, and 1.39 ms at 8k-16k. Equal to
# sglang's kernel in Triton's CPU interpreter (test/unit/srt/layers/attention/
# linear/test_gdn_track_snapshot.py); off until the captured extend with it
# equals eager on a GPU (test/gpu/test_gdn_extend_kernel.py, the *_track_kernel
# cases) and a served full graph with it (test probe
# GRAPHFIX_PROBE_GDN_TRACK_SNAPSHOT_KERNEL) is not slower. False: sglang's
# gather and kda_track_ssm_state.
GDN_TRACK_SNAPSHOT_KERNEL = False
# The index tables a captured GDN extend derives from the bucket's tables (the
# rows past the batch, FlashInfer's int64 cu_seqlens and checkpoint starts, the
# conv-window and chunk-state rows to track, ...) built once per forward, by its
# first GDN layer, and read by the others
# (..layers.attention.linear.gdn_prefill_graph.ForwardTablesMemo), instead
# of by every layer: 31 small ops a layer on FlashInfer's prefill with
# prefix-cache tracking (14 on Triton's; counted at torch's dispatcher on CPU,
# the same calls on a GPU), each a node of the graph. Profiled served on an
# H100 at Qwen3.5-35B-A3B's dimensions (benchmark/results/gpu/serving_2026-12-07d/,
# 30 GDN layers, 4 x 256 tokens): 1416 device ops a prefill forward under the
# full graph against breakable's 896, and 3.2 ms more device time a forward (how
# much of it these ops take is not measured).
# The same ops on the same tables, so the same values; equal to per-layer
# tables on CPU through the backend's captured extend, over forwards on
# refilled tables (test/unit/srt/layers/attention/linear/test_gdn_backend.py).
# Off until a graph of two layers sharing them equals eager on a GPU
# (test/gpu/test_gdn_extend_kernel.py, the *_shared_tables cases) and a served
# full graph with it (test probe GRAPHFIX_PROBE_GDN_TABLES_ONCE_PER_FORWARD) is
# not slower. False: every layer builds its own.
GDN_TABLES_ONCE_PER_FORWARD = False


def flashinfer_gdn_prefill_captures(kernel: str | None, sm: int) -> bool:
    return (
        kernel == "flashinfer"
        and FLASHINFER_GDN_CAPTURE_SM is not None
        and sm == FLASHINFER_GDN_CAPTURE_SM
    )


def _captured_gdn_kernels() -> str:
    if FLASHINFER_GDN_CAPTURE_SM is None:
        return "the Triton kernels"
    return f"the Triton kernels, or FlashInfer's on SM{FLASHINFER_GDN_CAPTURE_SM}"


def _gdn_prefill_kernel() -> Condition:
    return Condition(
        setting="--linear-attn-prefill-backend",
        violated=lambda s: (
            s.linear_prefill_kernel != "triton"
            and not flashinfer_gdn_prefill_captures(s.linear_prefill_kernel, s.sm)
        ),
        reason=lambda s: (
            f"the captured GDN extend runs {_captured_gdn_kernels()}, not "
            f"{s.linear_prefill_kernel}"
            + (
                f" on SM{s.sm}"
                if s.sm and FLASHINFER_GDN_CAPTURE_SM is not None
                else ""
            )
        ),
        fix=lambda s: "set --linear-attn-prefill-backend triton",
    )


def _triton_kernel(family: str) -> Condition:
    return Condition(
        setting="--linear-attn-prefill-backend",
        violated=lambda s: s.linear_prefill_kernel != "triton",
        reason=lambda s: (
            f"the captured {family} extend runs the Triton kernels, not "
            f"{s.linear_prefill_kernel}"
        ),
        fix=lambda s: "set --linear-attn-prefill-backend triton",
    )


_NO_CAPTURABLE_EXTEND = (
    "{family} linear attention has no capturable extend (its kernels read "
    "host-side sequence lengths, and sglang plans only its decode and verify out "
    "of graph)"
)

GDN_CONDITIONS = (
    _gdn_prefill_kernel(),
    # GDNAttnBackend.init_forward_metadata builds multi-item-scoring metadata on
    # the host for every batch (build_gdn_mis_metadata).
    Condition(
        setting="--enable-mis",
        violated=lambda s: s.enable_mis,
        reason=lambda s: (
            "GDN multi-item scoring (--enable-mis) builds host-side metadata per batch"
        ),
    ),
    # A page-major (or unified-memory) pool strides the GDN state, and the
    # prefill kernels run on gathered contiguous copies (GDNAttnBackend's
    # needs_state_gather) that a captured extend cannot hold.
    Condition(
        setting="--enable-page-major-kv-layout / --enable-unified-memory",
        violated=lambda s: s.page_major_kv_layout,
        reason=lambda s: (
            "the page-major KV layout (--enable-page-major-kv-layout, implied by "
            "--enable-unified-memory) strides the GDN state pools, which the captured "
            "extend reads in place"
        ),
    ),
)

KDA_CONDITIONS = (
    Condition(
        setting="KDA_FULL_PREFILL_GRAPH (sglang_graphfix.srt.full_prefill_graph_capability)",
        violated=lambda s: not KDA_FULL_PREFILL_GRAPH,
        reason=lambda s: _NO_CAPTURABLE_EXTEND.format(family="KDA"),
    ),
    _triton_kernel("KDA"),
    # The conditions of KDAAttnBackend.supports_prefill_graph_extend.
    Condition(
        setting="SGLANG_DISABLE_KDA_PREFILL_GRAPH_EXTEND",
        violated=lambda s: s.kda_graph_extend_disabled,
        reason=lambda s: (
            "SGLANG_DISABLE_KDA_PREFILL_GRAPH_EXTEND turns off the KDA prefill-graph "
            "tables the captured extend runs on"
        ),
        fix=lambda s: "unset SGLANG_DISABLE_KDA_PREFILL_GRAPH_EXTEND",
    ),
    Condition(
        setting="--linear-attn-verify-backend",
        violated=lambda s: s.fused_accept_verify,
        reason=lambda s: (
            "KDA's FlashInfer verify (fused accept, with speculative decoding and "
            "no radix cache) stages state in every eager extend"
        ),
        fix=lambda s: "set --linear-attn-verify-backend triton",
    ),
)


MAMBA2_FAMILY = "Mamba2/short-conv"
# Inkling's short conv: sglang captures its full prefill graph itself (its model
# default on Hopper and Blackwell); this package leaves its request slots and
# prefill batches as sglang sets them.
INKLING_FAMILY = "Inkling short-conv"
# The mixers the captured extend does not run, and why (sglang 0.5.23):
# MambaMixer1's extend reads the sequence lengths on the host
# (.cpu().tolist()); ZAYA1's CCA extend and LFM2's bidirectional conv loop over
# host-side slots and lengths. LFM2's causal conv (a kernel whose grid is the
# request count) runs on per-bucket tables while LFM2_FULL_PREFILL_GRAPH is on.
_MIXERS = {
    "mamba1": (
        "Mamba-1 mixer (MambaMixer1: Falcon-Mamba, Mamba) reads host-side "
        "sequence lengths"
    ),
    "short-conv": (
        "short-conv layers (ShortConvAttnBackend: ZAYA1, LFM2's bidirectional "
        "encoder) loop over host-side slots and lengths"
    ),
    "lfm2": (
        "short-conv layers (ShortConvAttnBackend: LFM2) run on per-bucket tables "
        "that are switched off here (LFM2_FULL_PREFILL_GRAPH)"
    ),
    "lfm2-other": (
        "short-conv layers (ShortConvAttnBackend: LFM2-MoE, LFM2-VL) are not "
        "checked under a full graph (LFM2-MoE's fused conv sizes its grid from "
        "host-side lengths; only dense LFM2 has a GPU case)"
    ),
}
_PAGE_MAJOR = "--enable-page-major-kv-layout / --enable-unified-memory"
_MAMBA2_ATTENTION = "--attention-backend (Mamba2 checked)"
_MAMBA2_GROUPS = "mamba_n_groups (model config)"
_MAMBA2_STATE = "--mamba-ssm-dtype / SGLANG_MAMBA_CONV_DTYPE"


def _mamba2_extend_captured(s: Settings) -> bool:
    """The conditions below apply once the switch is on (while it is off the
    family is refused as a whole, as before)."""
    return MAMBA2_FULL_PREFILL_GRAPH


def _group_counts(counts: tuple) -> str:
    """(1,) -> "1 group", (1, 8) -> "1 or 8 groups"."""
    return " or ".join(map(str, counts)) + (" group" if counts == (1,) else " groups")


def _mamba2_not_covered(what: str) -> str:
    return (
        f"{what}: the captured Mamba2 extend takes plain prefill batches only "
        "(docs/mamba2_full_prefill_graph.md, 'Not designed yet')"
    )


# sglang's capture_prefill_graph (model_runner_components/cuda_graph_setup.py)
# collects one attention module per decoder layer
# (layer_setup.compute_attention_and_moe_layers: self_attn.attn, attn, mixer.attn,
# a NemotronH Mamba layer itself) and, unless the model takes sglang's hybrid
# breakable graph (supports_hybrid_prefill_graph: NemotronH on SM120, its
# layers each with attention or MoE), turns the prefill graph off, full and
# breakable alike, when a layer has none (has_standard_gqa_for_all_local_layers;
# INFO "Disable prefill CUDA graph because some layers do not apply Standard
# GQA"): every prefill then runs eagerly.
_LAYER_SCAN = "sglang's prefill graph setup (layers without attention)"
_LAYER_SCAN_OFF = (
    "sglang 0.5.23 captures no prefill graph for this model: its prefill graph "
    "setup (capture_prefill_graph) finds no attention module in {layers} and runs "
    "every prefill eagerly ('some layers do not apply Standard GQA'), a breakable "
    "graph as well (NemotronH on SM120 without MLP layers excepted)"
)


_LAYER_GAPS_COVERED = (
    "; sglang-graphfix keeps a full prefill graph across NemotronH's MLP layers "
    "and GraniteMoeHybrid's Mamba2 layers only (checked on an H200), not across "
    "these"
)


class LayerGap(NamedTuple):
    """The layers of a Mamba2-family model in which sglang's prefill-graph setup
    finds no attention module (see _LAYER_SCAN_OFF)."""

    layers: str  # which, as a phrase
    # How many, where a full prefill graph runs them like any other layer
    # (NemotronH's MLP layers, GraniteMoeHybrid's Mamba2 layers, with
    # MAMBA2_LAYER_GAPS_CAPTURED on); None for the gaps the hook does not cover
    # (those with the switch off, NemotronH with MoE layers, pure Mamba2).
    full_graph_layers: int | None


def layer_gap(model_config) -> LayerGap | None:
    """The model's LayerGap; None when every layer has an attention module
    (Falcon-H1: attention beside Mamba2 in every layer)."""
    if _is_inkling(model_config):
        return None  # its own family (and mamba2_config reads the published context)
    config = mamba2_config(model_config)
    if isinstance(config, NemotronHConfig):  # NemotronH, its Nano VL's LLM, Puzzle
        kinds = [k for k in ("mlp", "moe") if k in config.layers_block_type]
        if not kinds:
            return None
        names = {"mlp": "MLP ('-')", "moe": "MoE ('E')"}
        return LayerGap(
            f"NemotronH's {' and '.join(names[k] for k in kinds)} layers",
            # MoE layers: only with NEMOTRON_H_MOE_LAYERS_CAPTURED (the H200
            # check had MLP layers); else the scan's verdict stands for them.
            None
            if "moe" in kinds and not NEMOTRON_H_MOE_LAYERS_CAPTURED
            else _kept(sum(kind in kinds for kind in config.layers_block_type)),
        )
    if isinstance(config, GraniteMoeHybridConfig):  # has Mamba layers, or not Mamba2
        mamba = sum(kind == "mamba" for kind in config.layer_types)
        return LayerGap("GraniteMoeHybrid's Mamba2 layers", _kept(mamba) or None)
    if isinstance(config, Mamba2Config):
        return LayerGap("any layer of a pure Mamba2 model", None)
    if isinstance(config, (Lfm2Config, Lfm2MoeConfig, Lfm2VlConfig)):
        # Every layer but "full_attention" holds `conv`, no attention module.
        conv = sum(kind != "full_attention" for kind in _lfm2_layer_types(config))
        if not conv:
            return None
        return LayerGap(
            "LFM2's short-conv layers",
            _kept(conv) if LFM2_FULL_PREFILL_GRAPH else None,
        )
    return None


def _lfm2_layer_types(config) -> list:
    text = getattr(config, "text_config", None) or config
    return list(getattr(text, "layer_types", None) or [])


def _kept(layers: int) -> int | None:
    """``layers`` where the scan's hook keeps a full graph across such a gap
    (MAMBA2_LAYER_GAPS_CAPTURED), else None."""
    return layers if MAMBA2_LAYER_GAPS_CAPTURED else None


def prefill_graph_turned_off(
    model_config, backend: str, sm: int, *, with_graphfix: bool = False
) -> str | None:
    """Why sglang's capture_prefill_graph turns this prefill graph backend
    ("full", "breakable") off for the model at startup (the layer scan above),
    None when it does not. sm: the compute capability, for NemotronH's hybrid
    breakable graph (SM120, every layer with attention or MoE). with_graphfix:
    with the scan's hook (keep_full_prefill_graph_across_mamba2_layer_gaps)."""
    gap = layer_gap(model_config)
    if gap is None or backend not in ("full", "breakable"):
        return None
    if with_graphfix and backend == "full" and gap.full_graph_layers:
        return None
    config = mamba2_config(model_config)
    if (
        backend == "breakable"
        and sm == 120
        and isinstance(config, NemotronHConfig)
        and "mlp" not in config.layers_block_type
    ):
        return None
    return (
        f"no attention module in {gap.layers}: 'some layers do not apply Standard GQA'"
    )


MAMBA2_CONDITIONS = (
    Condition(
        setting="MAMBA2_FULL_PREFILL_GRAPH (sglang_graphfix.srt.full_prefill_graph_capability)",
        violated=lambda s: not MAMBA2_FULL_PREFILL_GRAPH,
        reason=lambda s: _NO_CAPTURABLE_EXTEND.format(family=MAMBA2_FAMILY),
    ),
    Condition(
        setting="Mamba2/short-conv (mixer)",
        violated=lambda s: (
            _mamba2_extend_captured(s)
            and s.mamba_mixer in _MIXERS
            and not (s.mamba_mixer == "lfm2" and LFM2_FULL_PREFILL_GRAPH)
        ),
        reason=lambda s: (
            f"the captured extend runs MambaMixer2 layers only; this model's "
            f"{_MIXERS[s.mamba_mixer]}"
        ),
    ),
    # --enable-mixed-chunk makes the runner replay the full graph on
    # prefill+decode batches.
    Condition(
        setting="--enable-mixed-chunk",
        violated=lambda s: _mamba2_extend_captured(s) and s.mixed_chunk,
        reason=lambda s: _mamba2_not_covered(
            "mixed prefill+decode batches (--enable-mixed-chunk)"
        ),
        fix=lambda s: "drop --enable-mixed-chunk",
    ),
    Condition(
        setting="--speculative-algorithm",
        violated=lambda s: _mamba2_extend_captured(s) and s.speculative,
        reason=lambda s: _mamba2_not_covered(
            "speculative decoding (draft extend, target verify)"
        ),
    ),
    Condition(
        setting="--enable-two-batch-overlap",
        violated=lambda s: _mamba2_extend_captured(s) and s.two_batch_overlap,
        reason=lambda s: _mamba2_not_covered(
            "two-batch overlap (split batches size their metadata on the host)"
        ),
        fix=lambda s: "drop --enable-two-batch-overlap",
    ),
    Condition(
        setting=_LAYER_SCAN,
        violated=lambda s: (
            _mamba2_extend_captured(s)
            and s.layer_gap is not None
            and not s.layer_gap_layers
        ),
        reason=lambda s: (
            _LAYER_SCAN_OFF.format(layers=s.layer_gap)
            + (_LAYER_GAPS_COVERED if MAMBA2_LAYER_GAPS_CAPTURED else "")
        ),
    ),
    Condition(
        setting="--dtype",
        violated=lambda s: (
            _mamba2_extend_captured(s)
            and s.model_dtype not in (None, MAMBA2_CHECKED["dtype"])
        ),
        reason=lambda s: (
            f"the captured Mamba2 extend is checked on a GPU in "
            f"{MAMBA2_CHECKED['dtype']} only; this model serves in {s.model_dtype}"
        ),
        fix=lambda s: f"set --dtype {MAMBA2_CHECKED['dtype']}",
    ),
    # Only where the backend plans a full extend at all (else the attention
    # conditions below refuse it, advising the Mamba2-checked backend).
    Condition(
        setting=_MAMBA2_ATTENTION,
        violated=lambda s: (
            _mamba2_extend_captured(s)
            and s.attention_backend in FULL_PREFILL_ATTENTION_BACKENDS
            and s.attention_backend != MAMBA2_CHECKED["attention"]
        ),
        reason=lambda s: (
            "the captured Mamba2 extend is checked on a GPU with the "
            f"{MAMBA2_CHECKED['attention']} attention backend only, not "
            f"{s.attention_backend}"
        ),
        fix=lambda s: f"set --attention-backend {MAMBA2_CHECKED['attention']}",
    ),
    Condition(
        setting=_MAMBA2_GROUPS,
        violated=lambda s: (
            _mamba2_extend_captured(s)
            and s.mamba_groups not in (None, *MAMBA2_CHECKED["groups"])
        ),
        reason=lambda s: (
            "the captured Mamba2 extend is checked on a GPU with "
            f"{_group_counts(MAMBA2_CHECKED['groups'])} only; this model's Mamba2 "
            f"layers have {s.mamba_groups}"
        ),
    ),
    Condition(
        setting=_MAMBA2_STATE,
        violated=lambda s: (
            _mamba2_extend_captured(s)
            and s.mamba_state_dtypes not in (None, MAMBA2_CHECKED["state"])
        ),
        reason=lambda s: (
            "the captured Mamba2 extend is checked on a GPU with {} SSM / {} conv "
            "states only; this server has {} / {}".format(
                *MAMBA2_CHECKED["state"], *s.mamba_state_dtypes
            )
        ),
        fix=lambda s: _keep_full_with_mamba2_state(s),
    ),
    Condition(
        setting=_PAGE_MAJOR,
        violated=lambda s: _mamba2_extend_captured(s) and s.page_major_kv_layout,
        reason=lambda s: (
            "the page-major KV layout (--enable-page-major-kv-layout, implied by "
            "--enable-unified-memory) strides the Mamba2 state pools, which the "
            "captured extend has not been checked on"
        ),
    ),
)


def mamba2_model_facts(model_config) -> dict:
    """The Mamba2 conditions' facts a model config decides (at config and at
    capture time alike): the layers sglang's prefill-graph setup skips, the
    dtype the weights are served in, the mixers' groups (NemotronH, Falcon-H1
    and Granite build MambaMixer2 from mamba_n_groups, pure Mamba2 from
    n_groups) and the state pools' dtypes (mamba2_state_dtype: the config's
    mamba_ssm_dtype, --mamba-ssm-dtype / SGLANG_MAMBA_SSM_DTYPE,
    SGLANG_MAMBA_CONV_DTYPE)."""
    gap = layer_gap(model_config)
    facts = {
        "layer_gap": gap.layers if gap else None,
        "layer_gap_layers": gap.full_graph_layers if gap else None,
    }
    config = mamba2_config(model_config)
    if config is None or _is_inkling(model_config):
        return facts
    state = mamba2_state_dtype(config)
    return {
        **facts,
        "model_dtype": _dtype_name(model_config.dtype),
        "mamba_groups": getattr(config, "mamba_n_groups", None)
        or getattr(config, "n_groups", None),
        "mamba_state_dtypes": (_dtype_name(state.temporal), _dtype_name(state.conv)),
    }


def _keep_full_with_mamba2_state(s: Settings) -> str:
    ssm, conv = MAMBA2_CHECKED["state"]
    fixes = []
    if s.mamba_state_dtypes[0] != ssm:
        fixes.append(f"set --mamba-ssm-dtype {ssm}")
    if s.mamba_state_dtypes[1] != conv:
        fixes.append(f"set SGLANG_MAMBA_CONV_DTYPE={conv}")
    return "; ".join(fixes)


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def mamba_mixer_of_config(model_config) -> str | None:
    """The Mamba layers sglang builds for a Mamba2-family config (the split of
    attention_registry.attn_backend_wrapper and the models' mixers)."""
    if _is_inkling(model_config):
        # Its own family; mamba2_config would read the published runtime context.
        return "short-conv"
    config = mamba2_config(model_config)
    if config is None:
        return None
    if isinstance(config, (Lfm2Config, Lfm2MoeConfig, Lfm2VlConfig)):
        architectures = getattr(model_config.hf_config, "architectures", None) or []
        if any("Bidirectional" in a for a in architectures):
            return "short-conv"
        dense = type(config) is Lfm2Config and isinstance(
            model_config.hf_config, Lfm2Config
        )
        return "lfm2" if dense else "lfm2-other"
    if isinstance(config, ZayaConfig):
        return "short-conv"
    if isinstance(config, (MambaConfig, FalconMambaConfig)):
        return "mamba1"
    return "mamba2"


def _model_config_of_backend(linear):
    """The model config a live Mamba2 or short-conv backend was built for (its
    model runner's)."""
    if not isinstance(linear, (Mamba2AttnBackend, ShortConvAttnBackend)):
        return None
    model_runner = getattr(linear, "_model_runner", None)
    return getattr(model_runner, "model_config", None)


def is_lfm2_short_conv(linear) -> bool:
    """A live backend of dense LFM2's short-conv layers (not Inkling's
    subclass, not ZAYA1, not LFM2-MoE / LFM2-VL)."""
    return (
        type(linear) is ShortConvAttnBackend
        and _mamba_mixer_of_backend(linear) == "lfm2"
    )


def _mamba_mixer_of_backend(linear) -> str | None:
    if not isinstance(linear, (Mamba2AttnBackend, ShortConvAttnBackend)):
        return None
    model_config = _model_config_of_backend(linear)
    if model_config is None:  # unknown: the backend's own kind
        return "short-conv" if isinstance(linear, ShortConvAttnBackend) else "mamba2"
    return mamba_mixer_of_config(model_config)


def _is_inkling(model_config) -> bool:
    return isinstance(model_config.hf_config, (InklingModelConfig, InklingMMConfig))


def _registry_defined(model_config) -> bool:
    return mambaish_config(model_config) is not None


# Linear-attention families, in attention_registry.attn_backend_wrapper's order.
#   GDN      this package's captured extend on static per-bucket tables
#            (..layers.attention.linear.gdn_prefill_graph), Triton kernels (or
#            FlashInfer's GDN prefill, FLASHINFER_GDN_CAPTURE_SM);
#   KDA      upstream's breakable-graph tables, Triton kernels only;
#   Inkling  upstream records its short-conv metadata inside the graph
#            (InklingShortConvAttnBackend.init_forward_metadata_in_graph);
#   Mamba2/short-conv  upstream's MambaMixer2 extend on static per-bucket
#            metadata, behind MAMBA2_FULL_PREFILL_GRAPH (off: refused as a
#            whole); LFM2's short conv on per-bucket tables
#            (LFM2_FULL_PREFILL_GRAPH); ZAYA1's and Mamba-1 stay refused.
# Lightning and registry-defined backends size their extend launches from host
# data.
LINEAR_FAMILIES = (
    LinearFamily(INKLING_FAMILY, _is_inkling, (InklingShortConvAttnBackend,), True),
    LinearFamily("GDN", lambda m: hybrid_gdn_config(m) is not None, (GDNAttnBackend,), True, GDN_CONDITIONS),
    LinearFamily(MAMBA2_FAMILY, lambda m: mamba2_config(m) is not None, (Mamba2AttnBackend, ShortConvAttnBackend), True, MAMBA2_CONDITIONS),
    LinearFamily("KDA", lambda m: hybrid_kda_config(m) is not None, (KDAAttnBackend,), True, KDA_CONDITIONS),
    LinearFamily("Lightning", lambda m: hybrid_lightning_config(m) is not None, (LightningAttentionBackend,), False),
    LinearFamily("registry-defined", _registry_defined, (), False),
)  # fmt: skip

_FAMILIES = {family.name: family for family in LINEAR_FAMILIES}


def linear_family_of_config(model_config) -> LinearFamily | None:
    """The family sglang builds for this model config, None without linear attention."""
    return next((f for f in LINEAR_FAMILIES if f.recognises(model_config)), None)


def linear_family_of_backend(linear) -> LinearFamily:
    """The family of a live linear-attention backend (registry-defined when no
    listed class matches)."""
    return next(
        (f for f in LINEAR_FAMILIES if isinstance(linear, f.backends)),
        _FAMILIES["registry-defined"],
    )


def family_label(model_config) -> str | None:
    """The family as explain and the messages name it (a registry-defined one
    with its backend class)."""
    family = linear_family_of_config(model_config)
    if family is None or family.name != "registry-defined":
        return family and family.name
    spec = linear_attn_model_spec(model_config)
    backend = spec.backend_class_name.rsplit(".", 1)[-1] if spec else "unknown"
    return f"registry-defined ({backend})"


# ---- the full-attention side ----

# Prefill attention backends whose init_forward_metadata_out_graph plans a plain
# EXTEND for a full prefill graph, read from sglang 0.5.23's backends:
#   fa3, fa4    FlashAttentionBackend._init_full_cg_prefill_metadata (MHA and MLA);
#               also the only backend with supports_full_cuda_graph_chunked_prefix,
#               which PrefillCudaGraphRunner asserts for MLA models that keep the
#               chunked prefix cache.
#   flashinfer  FlashInferAttnBackend plans it on full_cg_prefill_wrappers; MHA only,
#               since "flashinfer" on an MLA model is FlashInferMLAAttnBackend.
# Every other backend fails in capture or replay: triton and trtllm_mha
# (_apply_cuda_graph_metadata: "Invalid forward mode ... for CUDA Graph replay"),
# FlashInferMLAAttnBackend and its subclasses flashmla / trtllm_mla / cutedsl_mla
# ("Invalid mode"), dsa (no EXTEND branch), dsv4 (_GraphBucket raises
# NotImplementedError), aiter and wave ("Invalid forward mode"), hpc_ops (asserts
# decode); torch_native and flex_attention turn every graph off themselves.
FULL_PREFILL_ATTENTION_BACKENDS = ("fa3", "fa4", "flashinfer")
FULL_PREFILL_MLA_ATTENTION_BACKENDS = ("fa3", "fa4")

_TRITON_FAILURE = (
    " (its capture fails with 'Invalid forward mode EXTEND for CUDA Graph replay')"
)


def attention_backend_runs(backend: str, *, mla: bool, sm: int) -> bool:
    """Whether sglang builds this attention backend on this GPU at all: its fa3
    factory (attention_registry.create_flashattention_v3_backend) asserts SM9x,
    or SM8x for a model without MLA. sm 0 (unknown): assumed."""
    if backend != "fa3" or not sm:
        return True
    return sm // 10 == 9 or (sm // 10 == 8 and not mla)


def attention_backend_advised(backend: str, *, mla: bool, sm: int) -> bool:
    """Whether to name this backend as a remedy on this GPU: it runs there, and
    sglang itself selects it there (fa4 only on Hopper and Blackwell, as its
    model overrides do, e.g. Inkling's)."""
    if not attention_backend_runs(backend, mla=mla, sm=sm):
        return False
    return backend != "fa4" or not sm or sm // 10 in (9, 10)


def capturing_attention_backends(*, mla: bool, sm: int) -> tuple[str, ...]:
    """The attention backends to advise for a full prefill graph on this GPU."""
    capable = (
        FULL_PREFILL_MLA_ATTENTION_BACKENDS if mla else FULL_PREFILL_ATTENTION_BACKENDS
    )
    return tuple(b for b in capable if attention_backend_advised(b, mla=mla, sm=sm))


def _keep_full_with_attention(s: Settings) -> str | None:
    advised = capturing_attention_backends(mla=s.mla, sm=s.sm)
    if s.family == MAMBA2_FAMILY and _mamba2_extend_captured(s):
        advised = tuple(b for b in advised if b == MAMBA2_CHECKED["attention"])
    return "set --attention-backend " + " / ".join(advised) if advised else None


def _none_capture_here(s: Settings) -> str:
    if capturing_attention_backends(mla=s.mla, sm=s.sm):
        return ""
    return (
        f" (no attention backend that sglang runs on sm{s.sm} plans a full prefill "
        f"extend for {'MLA models' if s.mla else 'this model'})"
    )


def _plans_no_extend(s: Settings) -> bool:
    capable = (
        FULL_PREFILL_MLA_ATTENTION_BACKENDS
        if s.mla
        else FULL_PREFILL_ATTENTION_BACKENDS
    )
    return s.attention_backend not in capable


ATTENTION_CONDITIONS = (
    Condition(
        setting="--attention-backend",
        violated=_plans_no_extend,
        reason=lambda s: (
            f"the {s.attention_backend} attention backend{' (MLA)' if s.mla else ''} "
            "plans no extend for a full prefill graph"
            + (_TRITON_FAILURE if s.attention_backend == "triton" else "")
            + _none_capture_here(s)
        ),
        fix=_keep_full_with_attention,
    ),
    Condition(
        setting="--attention-backend (GPU architecture)",
        violated=lambda s: (
            not attention_backend_runs(s.attention_backend, mla=s.mla, sm=s.sm)
        ),
        reason=lambda s: (
            f"sglang's {s.attention_backend} attention backend does not run "
            f"{'MLA models ' if s.mla else ''}on sm{s.sm} at all "
            "(create_flashattention_v3_backend asserts SM90 for MLA models, SM80-SM90 "
            "otherwise): choose another --attention-backend" + _none_capture_here(s)
        ),
        fix=_keep_full_with_attention,
    ),
)


@dataclass(frozen=True)
class FullPrefillGraphSupport:
    """Whether a full prefill CUDA graph can capture this configuration, and why not."""

    architecture: str
    linear_attention: str | None  # the linear-attention family, None without one
    linear_prefill_kernel: str | None  # kernel of a GDN/KDA extend, else None
    attention_backend: str | None  # prefill full-attention backend; None: unresolved
    capturing_attention_backends: tuple[str, ...] = ()  # advised for this model and GPU
    reasons: tuple[str, ...] = ()  # empty: capable
    fixes: tuple[str, ...] = ()  # flags that keep the full graph, where one exists
    violated: tuple[str, ...] = field(default=(), compare=False)  # Condition.setting

    @property
    def capable(self) -> bool:
        return not self.reasons

    def describe(self) -> str:
        linear = self.linear_attention or "none"
        if self.linear_prefill_kernel:
            linear += f" (prefill kernel {self.linear_prefill_kernel})"
        attention = self.attention_backend or "not chosen yet (sglang's default)"
        return (
            f"architecture {self.architecture}, linear attention {linear}, "
            f"full-attention backend {attention}"
        )


def _captured_prefill_kernel(settings: Settings) -> str | None:
    """The extend kernel as told to users. With no GDN prefill kernel set, sglang
    picks FlashInfer's on SM90 for the models it validated
    (flashinfer_gdn_prefill_default: 128-dim heads, chunked prefill in range, fp32
    state), which the graph then captures; else Triton."""
    kernel = settings.linear_prefill_kernel
    if settings.linear_prefill_kernel_automatic and flashinfer_gdn_prefill_captures(
        "flashinfer", settings.sm
    ):
        return f"flashinfer where sglang picks it on SM{settings.sm}, else {kernel}"
    return kernel


def conditions_for(settings: Settings) -> tuple[Condition, ...]:
    """Every condition that applies to these settings: the linear family's, and
    the full-attention backend's once it is known (dLLM backends plan their own
    prefill-graph metadata)."""
    family = _FAMILIES.get(settings.family)
    conditions = family.conditions if family else ()
    if settings.attention_backend is not None and not settings.dllm:
        conditions += ATTENTION_CONDITIONS
    return conditions


def judge(settings: Settings, label: str | None = None) -> FullPrefillGraphSupport:
    """The verdict of the table on these settings."""
    reasons, fixes, violated = [], [], []
    family = _FAMILIES.get(settings.family)
    if family is not None and not family.captures:
        reasons.append(_NO_CAPTURABLE_EXTEND.format(family=label or family.name))
        violated.append(family.name)
    keepable = not reasons
    for condition in conditions_for(settings):
        if not condition.violated(settings):
            continue
        reasons.append(condition.reason(settings))
        violated.append(condition.setting)
        fix = condition.fix(settings) if condition.fix else None
        keepable = keepable and bool(fix)
        if fix and fix not in fixes:
            fixes.append(fix)
    if not keepable:  # flags that would not keep the full graph: none advised
        fixes = []
    return FullPrefillGraphSupport(
        architecture=settings.architecture,
        linear_attention=label or settings.family,
        linear_prefill_kernel=_captured_prefill_kernel(settings),
        attention_backend=settings.attention_backend,
        capturing_attention_backends=capturing_attention_backends(
            mla=settings.mla, sm=settings.sm
        ),
        reasons=tuple(reasons),
        fixes=tuple(fixes),
        violated=tuple(violated),
    )


def device_sm() -> int:
    """The GPU's compute capability as sglang's platform probes report it (as
    simulated by sglang_graphfix.cli.simulated_gpu); 0 off CUDA."""
    platform = get_platform()
    return int(platform.device_sm or 0) if platform.is_cuda else 0


# ---- config time ----


def _fused_accept_verify(cfg) -> bool:
    """KDAAttnBackend._can_fuse_accept_state on the resolved arguments: the verify
    kernel sglang resolves (resolve_linear_attn_backends: the flag, else decode's
    FlashInfer, else Triton) is FlashInfer, with speculative decoding, no radix
    cache, no replay-SSM ring and no PD disaggregation."""
    decode = cfg.linear_attn_decode_backend or cfg.linear_attn_backend
    verify = cfg.linear_attn_verify_backend or (
        "flashinfer" if decode == "flashinfer" else "triton"
    )
    return (
        verify == "flashinfer"
        and cfg.speculative_algorithm is not None
        and bool(cfg.disable_radix_cache)
        and not cfg.enable_linear_replayssm_spec
        and cfg.disaggregation_mode == "null"
    )


def settings_from_server_args(server_args: Any) -> tuple[Settings, str | None]:
    """The facts from the (resolved so far) server arguments, and the family label."""
    from sglang.srt.arg_groups.overrides import (
        attention_backends_of,
        model_config_of,
        resolved_view,
        resolving_view,
        use_mla_backend,
    )

    cfg = resolving_view(server_args)
    model_config = model_config_of(server_args)
    family = linear_family_of_config(model_config)
    kernel = None
    if family is not None and family.name in ("GDN", "KDA"):
        # Under a full prefill graph an automatic FlashInfer prefill default is
        # either capturable (GDN on FLASHINFER_GDN_CAPTURE_SM) or off (GDN else:
        # ..layers.attention.linear.gdn_backend; KDA: upstream's
        # flashinfer_kda_prefill_default), so the kernel to judge is the one
        # configured.
        kernel = cfg.linear_attn_prefill_backend or cfg.linear_attn_backend
    automatic = (
        family is not None
        and family.name == "GDN"
        and cfg.linear_attn_prefill_backend is None
        and kernel == "triton"
    )
    attention, _ = attention_backends_of(resolved_view(server_args))
    settings = Settings(
        architecture=model_config.hf_config.architectures[0],
        family=family and family.name,
        linear_prefill_kernel=kernel,
        linear_prefill_kernel_automatic=automatic,
        fused_accept_verify=_fused_accept_verify(cfg),
        enable_mis=bool(cfg.enable_mis),
        page_major_kv_layout=bool(
            cfg.enable_page_major_kv_layout or cfg.enable_unified_memory
        ),
        kda_graph_extend_disabled=envs.SGLANG_DISABLE_KDA_PREFILL_GRAPH_EXTEND.get(),
        attention_backend=attention,
        mla=use_mla_backend(server_args),
        sm=device_sm(),
        dllm=cfg.dllm_algorithm is not None,
        **(
            dict(
                mamba_mixer=mamba_mixer_of_config(model_config),
                mixed_chunk=bool(cfg.enable_mixed_chunk),
                speculative=cfg.speculative_algorithm is not None,
                two_batch_overlap=bool(cfg.enable_two_batch_overlap),
                **mamba2_model_facts(model_config),
            )
            if family is not None and family.name == MAMBA2_FAMILY
            else {}
        ),
    )
    return settings, family_label(model_config)


def full_prefill_graph_support(server_args: Any) -> FullPrefillGraphSupport:
    """Config time: can a full prefill CUDA graph capture this model with the
    settings resolved so far, on this GPU? The full-attention backend is judged
    once known (set by the user, or after sglang resolves it)."""
    settings, label = settings_from_server_args(server_args)
    return judge(settings, label)


# ---- capture time ----


def _kernel_name(kernel) -> str:
    if isinstance(kernel, (TritonGDNKernel, TritonKDAKernel)):
        return "triton"
    if isinstance(kernel, FlashInferGDNKernel):
        return "flashinfer"
    return type(kernel).__name__


def settings_from_linear_backend(linear, prefill_runner=None) -> Settings:
    """The facts from a live linear-attention backend (and, for the full-attention
    side, from the prefill runner when there is one in hand)."""
    family = linear_family_of_backend(linear)
    dispatcher = getattr(linear, "kernel_dispatcher", None)
    kernel = None
    if family.name in ("GDN", "KDA") and dispatcher is not None:
        kernel = _kernel_name(dispatcher.extend_kernel)
    model_runner = getattr(prefill_runner, "model_runner", None)
    attention = getattr(model_runner, "prefill_attention_backend_str", None)
    return Settings(
        architecture=type(linear).__name__,
        family=family.name,
        linear_prefill_kernel=kernel,
        fused_accept_verify=getattr(linear, "accept_lens_pool", None) is not None,
        enable_mis=bool(getattr(linear, "enable_mis", False)),
        page_major_kv_layout=bool(get_memory().enable_page_major_kv_layout),
        kda_graph_extend_disabled=envs.SGLANG_DISABLE_KDA_PREFILL_GRAPH_EXTEND.get(),
        attention_backend=attention,
        mla=bool(getattr(model_runner, "use_mla_backend", False)),
        sm=device_sm(),
        dllm=getattr(prefill_runner, "dllm_attention", None) is not None,
        **(
            _mamba2_runtime_facts(linear)
            if family.name == MAMBA2_FAMILY and MAMBA2_FULL_PREFILL_GRAPH
            else {}
        ),
    )


def _mamba2_runtime_facts(linear) -> dict:
    """The Mamba2 conditions' facts from the published runtime context (read
    only with the switch on: off, the family is refused whatever they are)."""
    model_config = _model_config_of_backend(linear)
    return dict(
        mamba_mixer=_mamba_mixer_of_backend(linear),
        mixed_chunk=bool(get_schedule().enable_mixed_chunk),
        speculative=get_spec().speculative_algorithm is not None,
        two_batch_overlap=bool(get_exec().overlap.enable_two_batch_overlap),
        **(mamba2_model_facts(model_config) if model_config else {}),
    )


def require_capturable_full_prefill_graph(linear, prefill_runner=None) -> None:
    """Capture time: assert what config time decided. Raises ValueError naming
    the conditions when the live backends cannot capture (resolution ran without
    sglang-graphfix's rules, or predicted these facts wrongly)."""
    support = judge(settings_from_linear_backend(linear, prefill_runner))
    if support.capable:
        return
    keep = f" Or keep it: {'; '.join(support.fixes)}." if support.fixes else ""
    raise ValueError(
        f"Full prefill CUDA graph cannot capture this {support.linear_attention} "
        f"extend ({type(linear).__name__}): {'; '.join(support.reasons)}. "
        "sglang-graphfix refuses this configuration when the server arguments "
        "resolve; `sglang-graphfix explain` with the same flags shows the plan. "
        f"Use --cuda-graph-backend-prefill disabled (or breakable, where sglang's "
        f"breakable rules accept the model) instead.{keep}"
    )
