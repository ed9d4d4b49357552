"""One random batch (test/mamba2_prefill_graph_cases.py) through sglang's own Mamba2
call path, Mamba2AttnBackend.forward -> MambaMixer2.forward (upstream's code, on
a small stand-in layer: projections, conv weights, A/D/dt_bias), twice on copies
of the same pools:

* eager: Mamba2AttnBackend.init_forward_metadata on the scheduler's batch, then
  the forward on the batch's tokens;
* as the full prefill graph runs it, with sglang-graphfix's patches applied and
  MAMBA2_FULL_PREFILL_GRAPH on: HybridLinearAttnBackend.init_forward_metadata_out_graph
  on the runner's capture batch, a warm-up forward on scratch pools, the forward
  on the whole bucket with the capture batch (captured in a torch.cuda.CUDAGraph
  when ``capture_graph``: the Python decisions a replay repeats are the
  capture's), then the refill on the runner's slot-padded replay view and the
  replay (under ``torch.cuda.set_sync_debug_mode("error")`` on a GPU).

Used by the CPU interpreter script
(test/unit/srt/layers/attention/mamba/interpret_mamba2_backend.py, which sets
TRITON_INTERPRET first and binds mamba.py's CUDA-only conv entry points) and by
test/gpu/test_mamba2_extend_graph.py. The caller applies sglang-graphfix's
patches (sglang_graphfix.register())."""

import contextlib
import types
from types import SimpleNamespace

import torch
from mamba2_prefill_graph_cases import (
    CONV_LEN,
    SLOT_OF_ROW,
    capture_batch,
    graph_runtime,
    live_batch,
    make_case,
    mamba2_backend,
    replay_view,
)

from sglang.srt.layers.attention import hybrid_linear_attn_backend as upstream
from sglang.srt.layers.attention.mamba import mamba
from sglang_graphfix.srt.layers.attention import (
    hybrid_linear_attn_backend as ours_hybrid,
)
from sglang_graphfix.srt.layers.attention.mamba import mamba2_prefill_graph as ours

HIDDEN, HEADS, HEAD_DIM, GROUPS, STATE = 16, 2, 8, 1, 8
WIDTH = CONV_LEN + 1
INNER = HEADS * HEAD_DIM
CONV_DIM = INNER + 2 * GROUPS * STATE


def stand_in_mixer(gen, device):
    """MambaMixer2's attributes at TP 1, with its forward (upstream's code)."""

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device)

    w_in = rand(HIDDEN, INNER + CONV_DIM + HEADS, scale=HIDDEN**-0.5)
    w_out = rand(INNER, HIDDEN, scale=INNER**-0.5)
    mixer = SimpleNamespace(
        tp_size=1, intermediate_size=INNER, conv_dim=CONV_DIM, num_heads=HEADS,
        head_dim=HEAD_DIM, n_groups=GROUPS, ssm_state_size=STATE,
        groups_ssm_state_size=GROUPS * STATE, activation="silu",
        in_proj=lambda x: (x @ w_in, None),
        conv1d=SimpleNamespace(weight=rand(CONV_DIM, 1, WIDTH) / WIDTH, bias=rand(CONV_DIM)),
        A=-torch.rand(HEADS, generator=gen).to(device), D=rand(HEADS), dt_bias=rand(HEADS),
        # Mixer2RMSNormGated's math (gate through SiLU, RMS norm per group).
        norm=lambda y, gate: torch.nn.functional.rms_norm(
            y * torch.nn.functional.silu(gate), (INNER,)
        ),
        out_proj=lambda y: (y @ w_out, None),
    )  # fmt: skip
    mixer.forward = types.MethodType(mamba.MambaMixer2.forward, mixer)
    return mixer


class Pools:
    """One layer's conv/SSM pools (copies of the given ones)."""

    def __init__(self, conv, ssm):
        self.conv, self.ssm = conv.clone(), ssm.clone()

    def mamba2_layer_cache(self, layer_id):
        return SimpleNamespace(conv=[self.conv], temporal=self.ssm)


def backend_on(case, pools, device):
    backend = mamba2_backend(case.chunk, device)
    backend.req_to_token_pool.mamba2_layer_cache = pools.mamba2_layer_cache
    backend.enable_unified_memory = False
    return backend


def hybrid_of(linear, full=None):
    """A HybridLinearAttnBackend over ``linear`` and ``full`` (default: a
    full-attention side that plans nothing)."""
    hybrid = upstream.HybridLinearAttnBackend.__new__(upstream.HybridLinearAttnBackend)
    hybrid.full_attn_backend = full or SimpleNamespace(
        init_forward_metadata_out_graph=lambda *a, **k: None
    )
    hybrid.linear_attn_backend = linear
    hybrid.attn_backend_list = [hybrid.full_attn_backend, linear]
    return hybrid


# Deliberately wrong metadata after the replay's refill, each on a seed where it
# matters: the comparison must see them.
MUTATIONS = {
    "no-initial-states": 0,  # prefixes ignored
    "recompute-end-off-by-one": 14,  # a snapshot one token late
    "snapshots-dropped": 4,  # every track row writes the padding slot
}


def _mutate(meta, mutate):
    if mutate == "no-initial-states":
        meta.tables.has_initial_states.zero_()
    elif mutate == "recompute-end-off-by-one":
        meta.track.end_loc[meta.track.mode == ours.TRACK_RECOMPUTE_STATE] += 1
    elif mutate == "snapshots-dropped":
        meta.track.dst.zero_()


@contextlib.contextmanager
def _sync_checked(device):
    """On a GPU: any host synchronisation raises (what a replay must not do)."""
    if torch.device(device).type != "cuda":
        yield
        return
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


def run_case(seed, mutate="", *, device="cpu", capture_graph=False, chunks=(4, 8, 16)):
    """The eager and the graph-side run of case ``seed``; a dict of the largest
    differences of the real tokens' outputs and of every conv/SSM pool slot but
    the reserved padding slot 0 (request slots, track slots and untouched slots
    alike). On odd seeds the bucket has request buckets (capture_request_buckets,
    recorded as the runner records them; on seeds 3 mod 4 one bucket, of one
    request more than the batch), and the graph is the one the batch
    replays: over the smallest request bucket that holds it, as the runner
    captures it (CAPTURE_REQUEST_SLOTS set), else over every slot."""
    case = make_case(seed, chunks=chunks)
    gen = torch.Generator().manual_seed(seed)
    mixer = stand_in_mixer(gen, device)
    slots = len(SLOT_OF_ROW) + 128  # request slots, then track slots (100 + row)
    conv = torch.randn(slots, CONV_DIM, CONV_LEN, generator=gen).to(device)
    ssm = torch.randn(slots, HEADS, HEAD_DIM, STATE, generator=gen).to(device)
    hidden = torch.randn(case.bucket, HIDDEN, generator=gen).to(device)
    total = sum(case.lens)
    triton_conv = seed % 2 == 0  # NemotronH / Granite: True; Falcon-H1's extend: False
    # With the mamba extra buffer the capture batch carries a track mask; here
    # also for some batches that track nothing.
    track = case.tracked is not None or seed % 3 == 0

    with contextlib.ExitStack() as stack:
        for patch in graph_runtime(case):
            stack.enter_context(patch)

        eager_pools = Pools(conv, ssm)
        eager = backend_on(case, eager_pools, device)
        live = live_batch(case, device)
        eager.init_forward_metadata(live)
        eager_out = eager.forward(
            mixer, hidden[:total], None, layer_id=0, forward_batch=live,
            use_triton_causal_conv=triton_conv,
        )  # fmt: skip

        graph_pools = Pools(conv, ssm)
        graph = backend_on(case, graph_pools, device)
        hybrid = hybrid_of(graph)
        graph_slots = case.slots
        if seed % 2:
            buckets = ours_hybrid.capture_request_buckets(
                graph, case.bucket, case.slots
            )
            padded = len(case.lens) + 1  # a request bucket with one padding slot
            if seed % 4 == 3:
                buckets = (padded,) if padded < min(case.slots, case.bucket) else ()
            setattr(hybrid, ours_hybrid.REQUEST_BUCKETS, {case.bucket: buckets})
            graph_slots = (
                ours_hybrid.replay_request_slots(hybrid, case.bucket, len(case.lens))
                or case.slots
            )
        if graph_slots < case.slots:
            setattr(hybrid, ours_hybrid.CAPTURE_REQUEST_SLOTS, graph_slots)
        capture = capture_batch(case, track, device)
        hybrid.init_forward_metadata_out_graph(capture, in_capture=True)
        setattr(hybrid, ours_hybrid.CAPTURE_REQUEST_SLOTS, None)
        captured_meta = graph.forward_metadata
        assert captured_meta.tables.max_requests == graph_slots
        assert isinstance(captured_meta, ours.Mamba2FullGraphMetadata)
        # The warm-up forward (the SSD kernels autotune), on scratch pools.
        scratch = Pools(conv, ssm)
        graph.req_to_token_pool.mamba2_layer_cache = scratch.mamba2_layer_cache
        graph.forward(
            mixer, hidden, None, layer_id=0, forward_batch=capture,
            use_triton_causal_conv=triton_conv,
        )  # fmt: skip
        graph.req_to_token_pool.mamba2_layer_cache = graph_pools.mamba2_layer_cache
        static_hidden = hidden.clone()

        def forward():
            return graph.forward(
                mixer, static_hidden, None, layer_id=0, forward_batch=capture,
                use_triton_causal_conv=triton_conv,
            )  # fmt: skip

        cuda_graph = None
        if capture_graph:
            cuda_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cuda_graph):
                graph_out = forward()
        graph.forward_metadata = None  # eager forwards in between replace it
        view = replay_view(case, live_batch(case, device), device)
        with _sync_checked(device):
            hybrid.init_forward_metadata_out_graph(view, in_capture=False)
        assert graph.forward_metadata is captured_meta  # the captured buffers
        _mutate(captured_meta, mutate)
        with _sync_checked(device):
            if cuda_graph is not None:
                cuda_graph.replay()
            else:
                graph_out = forward()
        modes = captured_meta.track.mode.tolist() if captured_meta.track else []

    def diff(a, b):
        return float((a - b).abs().max()) if a.numel() else 0.0

    return {
        "seed": seed,
        "mutate": mutate,
        "chunk": case.chunk,
        "bucket": case.bucket,
        "requests": len(case.lens),
        "slots": case.slots,
        "graph_slots": graph_slots,
        "tokens": total,
        "prefix": any(case.prefix),
        "tracked": sum(case.tracked) if case.tracked else 0,
        "track_tables": captured_meta.track is not None,
        "triton_conv": triton_conv,
        "modes": sorted(set(modes)),
        "out": diff(graph_out[:total], eager_out),
        "conv_pool": diff(graph_pools.conv[1:], eager_pools.conv[1:]),
        "ssm_pool": diff(graph_pools.ssm[1:], eager_pools.ssm[1:]),
        "finite": bool(graph_out.isfinite().all()),
    }
