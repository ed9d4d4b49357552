"""Runs test/mamba2_prefill_graph_cases.py's random batches through sglang's own
Mamba2 call path, Mamba2AttnBackend.forward -> MambaMixer2.forward (upstream's
code, on a small stand-in layer: projections, conv weights, A/D/dt_bias), with
its Triton kernels in the CPU interpreter, twice on copies of the same pools:

* eager: Mamba2AttnBackend.init_forward_metadata on the scheduler's batch, then
  the forward on the batch's tokens;
* as the full prefill graph runs it, with sglang-graphfix's patches applied and
  MAMBA2_FULL_PREFILL_GRAPH on: HybridLinearAttnBackend.init_forward_metadata_out_graph
  on the runner's capture batch (a forward on scratch pools, as the warm-up and
  capture run it), then on the runner's slot-padded replay view, and the forward
  on the whole bucket with the capture batch (the Python decisions a replay
  repeats are the capture's).

Prints one JSON line per case: the largest differences of the real tokens'
outputs and of every conv/SSM pool slot but the reserved padding slot 0 (the
request slots, the prefix-cache track slots and every other slot, which neither
run may touch). A script, not a test: TRITON_INTERPRET must be set before triton
is first imported (test_mamba2_prefill_graph.py runs it in a subprocess)."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import contextlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[6]
sys.path[:0] = [
    str(ROOT / "python"),
    str(ROOT / "sgl-kernel" / "python"),
    str(ROOT / "test"),
]

# The SSD wrappers enter the tensors' device context; torch.cpu has none.
torch.cpu.device = lambda index=None: contextlib.nullcontext()

from mamba2_prefill_graph_cases import (  # noqa: E402
    CONV_LEN,
    SLOT_OF_ROW,
    capture_batch,
    graph_runtime,
    live_batch,
    make_case,
    mamba2_backend,
    replay_view,
)
from triton.runtime.autotuner import Autotuner  # noqa: E402

import sglang_graphfix  # noqa: E402
from sglang.kernels.ops.mamba import causal_conv1d_triton  # noqa: E402
from sglang.kernels.ops.mamba.triton_ops import (  # noqa: E402
    ssd_bmm,
    ssd_chunk_scan,
    ssd_chunk_state,
    ssd_state_passing,
)
from sglang.srt.layers.attention import hybrid_linear_attn_backend as upstream  # noqa: E402
from sglang.srt.layers.attention.mamba import causal_conv1d, mamba  # noqa: E402
from sglang_graphfix.srt.layers.attention.mamba import (  # noqa: E402
    mamba2_prefill_graph as ours,
)

sglang_graphfix.register()

# Autotuning benchmarks on a GPU: the interpreter runs each kernel's first config.
for module in (ssd_bmm, ssd_chunk_scan, ssd_chunk_state, ssd_state_passing):
    for kernel in vars(module).values():
        if isinstance(kernel, Autotuner):
            kernel.configs = kernel.configs[:1]

# mamba.py binds its conv entry points only on CUDA (is_cuda()): bind them as on
# a GPU (the extend takes the Triton kernel there too, for a transposed input
# with seq_lens_cpu; causal_conv1d_fn picks it off CUDA anyway).
mamba.causal_conv1d_fn_triton = causal_conv1d_triton.causal_conv1d_fn
mamba.causal_conv1d_fn = causal_conv1d.causal_conv1d_fn

HIDDEN, HEADS, HEAD_DIM, GROUPS, STATE = 16, 2, 8, 1, 8
WIDTH = CONV_LEN + 1
INNER = HEADS * HEAD_DIM
CONV_DIM = INNER + 2 * GROUPS * STATE


def _mixer(gen):
    """MambaMixer2's attributes at TP 1, with its forward (upstream's code)."""

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen) * scale

    w_in = rand(HIDDEN, INNER + CONV_DIM + HEADS, scale=HIDDEN**-0.5)
    w_out = rand(INNER, HIDDEN, scale=INNER**-0.5)
    mixer = SimpleNamespace(
        tp_size=1, intermediate_size=INNER, conv_dim=CONV_DIM, num_heads=HEADS,
        head_dim=HEAD_DIM, n_groups=GROUPS, ssm_state_size=STATE,
        groups_ssm_state_size=GROUPS * STATE, activation="silu",
        in_proj=lambda x: (x @ w_in, None),
        conv1d=SimpleNamespace(weight=rand(CONV_DIM, 1, WIDTH) / WIDTH, bias=rand(CONV_DIM)),
        A=-torch.rand(HEADS, generator=gen), D=rand(HEADS), dt_bias=rand(HEADS),
        # Mixer2RMSNormGated's math (gate through SiLU, RMS norm per group).
        norm=lambda y, gate: torch.nn.functional.rms_norm(
            y * torch.nn.functional.silu(gate), (INNER,)
        ),
        out_proj=lambda y: (y @ w_out, None),
    )  # fmt: skip
    mixer.forward = types.MethodType(mamba.MambaMixer2.forward, mixer)
    return mixer


class _Pools:
    def __init__(self, conv, ssm):
        self.conv, self.ssm = conv.clone(), ssm.clone()

    def mamba2_layer_cache(self, layer_id):
        return SimpleNamespace(conv=[self.conv], temporal=self.ssm)


def _backend(case, pools):
    backend = mamba2_backend(case.chunk)
    backend.req_to_token_pool.mamba2_layer_cache = pools.mamba2_layer_cache
    backend.enable_unified_memory = False
    return backend


def _hybrid(linear):
    hybrid = upstream.HybridLinearAttnBackend.__new__(upstream.HybridLinearAttnBackend)
    hybrid.full_attn_backend = SimpleNamespace(
        init_forward_metadata_out_graph=lambda *a, **k: None
    )
    hybrid.linear_attn_backend = linear
    return hybrid


# Deliberately wrong metadata after the replay's refill, each on a seed where it
# matters: the comparison must see them.
MUTATIONS = {
    "no-initial-states": 0,  # prefixes ignored
    "recompute-end-off-by-one": 12,  # a snapshot one token late
    "snapshots-dropped": 4,  # every track row writes the padding slot
}


def _mutate(meta, mutate):
    if mutate == "no-initial-states":
        meta.tables.has_initial_states.zero_()
    elif mutate == "recompute-end-off-by-one":
        meta.track.end_loc[meta.track.mode == ours.TRACK_RECOMPUTE_STATE] += 1
    elif mutate == "snapshots-dropped":
        meta.track.dst.zero_()


def run_case(seed, mutate=""):
    case = make_case(seed, chunks=(4, 8, 16))
    gen = torch.Generator().manual_seed(seed)
    mixer = _mixer(gen)
    slots = len(SLOT_OF_ROW) + 128  # request slots, then track slots (100 + row)
    conv = torch.randn(slots, CONV_DIM, CONV_LEN, generator=gen)
    ssm = torch.randn(slots, HEADS, HEAD_DIM, STATE, generator=gen)
    hidden = torch.randn(case.bucket, HIDDEN, generator=gen)
    total = sum(case.lens)
    triton_conv = seed % 2 == 0  # NemotronH / Granite: True; Falcon-H1's extend: False
    # With the mamba extra buffer the capture batch carries a track mask; here
    # also for some batches that track nothing.
    track = case.tracked is not None or seed % 3 == 0

    with contextlib.ExitStack() as stack:
        for patch in graph_runtime(case):
            stack.enter_context(patch)

        eager_pools = _Pools(conv, ssm)
        eager = _backend(case, eager_pools)
        live = live_batch(case)
        eager.init_forward_metadata(live)
        eager_out = eager.forward(
            mixer, hidden[:total], None, layer_id=0, forward_batch=live,
            use_triton_causal_conv=triton_conv,
        )  # fmt: skip

        graph_pools = _Pools(conv, ssm)
        graph = _backend(case, graph_pools)
        hybrid = _hybrid(graph)
        capture = capture_batch(case, track)
        hybrid.init_forward_metadata_out_graph(capture, in_capture=True)
        captured_meta = graph.forward_metadata
        assert isinstance(captured_meta, ours.Mamba2FullGraphMetadata)
        real_pools = graph.req_to_token_pool.mamba2_layer_cache
        scratch = _Pools(conv, ssm)
        graph.req_to_token_pool.mamba2_layer_cache = scratch.mamba2_layer_cache
        graph.forward(
            mixer, hidden, None, layer_id=0, forward_batch=capture,
            use_triton_causal_conv=triton_conv,
        )  # fmt: skip
        graph.req_to_token_pool.mamba2_layer_cache = real_pools
        graph.forward_metadata = None  # eager forwards in between replace it
        hybrid.init_forward_metadata_out_graph(
            replay_view(case, live_batch(case)), in_capture=False
        )
        assert graph.forward_metadata is captured_meta  # the captured buffers
        _mutate(captured_meta, mutate)
        modes = captured_meta.track.mode.tolist() if track else []
        graph_out = graph.forward(
            mixer, hidden, None, layer_id=0, forward_batch=capture,
            use_triton_causal_conv=triton_conv,
        )  # fmt: skip

    def diff(a, b):
        return float((a - b).abs().max()) if a.numel() else 0.0

    return {
        "seed": seed,
        "mutate": mutate,
        "chunk": case.chunk,
        "bucket": case.bucket,
        "requests": len(case.lens),
        "slots": case.slots,
        "tokens": total,
        "prefix": any(case.prefix),
        "tracked": sum(case.tracked) if case.tracked else 0,
        "track_tables": track,
        "triton_conv": triton_conv,
        "modes": sorted(set(modes)),
        "out": diff(graph_out[:total], eager_out),
        "conv_pool": diff(graph_pools.conv[1:], eager_pools.conv[1:]),
        "ssm_pool": diff(graph_pools.ssm[1:], eager_pools.ssm[1:]),
        "finite": bool(graph_out.isfinite().all()),
    }


if __name__ == "__main__":
    seeds = [int(a) for a in sys.argv[1:]] or range(int(os.environ.get("CASES", 12)))
    runs = [(seed, "") for seed in seeds]
    if os.environ.get("MUTATE", "1") == "1":
        runs += [(seed, m) for m, seed in MUTATIONS.items()]
    for seed, mutate in runs:
        print(json.dumps(run_case(seed, mutate)), flush=True)
