"""gdn_extend_in_graph, captured once in a CUDA graph and replayed for several
batches (the rows past the batch left NaN, as an engine's memory pool may leave
them), against sglang's eager GDN extend (the same calls GDNAttnBackend makes:
causal_conv1d_fn with host lengths, then the delta rule with cu_seqlens), for
each prefill kernel the graph captures: sglang's Triton chunk kernels, and the
FlashInfer GDN prefill (FlashInferGDNKernel.extend, sglang's default on SM90)
with its eager checkpoint plan for the tracked states, also with only the rows
past the batch that its tiles load zeroed (GDN_FLASHINFER_ZEROES_KERNEL_REACH_ONLY),
and with the prefix-cache snapshot in one kernel launch (GDN_TRACK_SNAPSHOT_KERNEL),
and a layer reading the tables the forward's first layer built (GDN_TABLES_ONCE_PER_FORWARD).
A replay moves no state of the bucket's padding request slots: the reserved
padding slot keeps what it held, whatever the number of real requests."""

from types import SimpleNamespace

import pytest
import torch
from engine_utils import write_result

from sglang.kernels.ops.attention.fla.chunk import chunk_gated_delta_rule
from sglang.kernels.ops.attention.fla.index import prepare_chunk_offsets
from sglang.kernels.ops.attention.linear.fused_gdn_gating import fused_gdn_gating
from sglang.kernels.ops.attention.triton_gdn_fused_proj import (
    fused_qkv_split_gdn_prefill,
)
from sglang.srt.layers.attention.linear.kda_prefill_graph import (
    KDAPrefillGraphMetadata,
    build_track_rows,
)
from sglang.srt.layers.attention.linear.kernels.gdn_flashinfer import (
    FlashInferGDNKernel,
)
from sglang.srt.layers.attention.mamba.causal_conv1d import causal_conv1d_fn
from sglang_graphfix.srt import full_prefill_graph_capability as capability
from sglang_graphfix.srt.layers.attention.linear import gdn_prefill_graph
from sglang_graphfix.srt.layers.attention.linear.gdn_prefill_graph import (
    gdn_extend_in_graph,
)

HK, D, WIDTH = 2, 128, 4  # key heads, head dim, conv width
# Value heads: 4, and Qwen3-Next-80B's 32 at TP 1, where FlashInfer's algorithm
# choice (context-parallel below ~66 sequence-heads on an H200) differs between
# the table's 4 request slots (128: not CP) and an eager batch of 1 (32: CP).
VALUE_HEADS = (4, 32)


def _dim(hv):
    return (2 * HK + hv) * D


SLOTS, BUCKET, MAX_SEQS, CHUNK = 16, 256, 4, 64
DEV = "cuda"

# (extend lens, state slots, prefix lens, tracked rows, track slots)
BATCHES = [
    ([37, 100, 5], [3, 5, 7], [0, 10, 0], [True, True, False], [10, 11, 12]),
    ([64, 64, 128], [2, 4, 6], [1, 1, 1], [False, False, True], [10, 11, 12]),
    ([250], [9], [0], [True], [13]),
    ([1, 1, 1, 20], [1, 8, 14, 15], [5, 0, 7, 0], [False] * 4, [10, 11, 12, 13]),
    # One short request with a cached prefix on the bucket's 4 request slots (the
    # profiled 1-request prefill): 3 padding request slots, whose states the
    # replay must neither read nor write.
    ([16], [11], [3], [False], [10]),
]


def _layer(hv):
    g = torch.Generator(device=DEV).manual_seed(0)
    rand = lambda *s: torch.randn(*s, generator=g, device=DEV)  # noqa: E731
    return SimpleNamespace(
        layer_id=1,
        conv_weights=(rand(_dim(hv), WIDTH) * 0.5).bfloat16(),
        bias=None,
        activation="silu",
        A_log=torch.log(torch.rand(hv, generator=g, device=DEV) * 15 + 1),
        dt_bias=torch.ones(hv, device=DEV),
        num_q_heads=HK,
        num_k_heads=HK,
        num_v_heads=hv,
        head_q_dim=D,
        head_k_dim=D,
        head_v_dim=D,
        q_dim=HK * D,
        k_dim=HK * D,
        v_dim=hv * D,
    )


def _inputs(n, seed, hv):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(n, _dim(hv), generator=g, device=DEV).bfloat16()
    a = torch.randn(n, hv, generator=g, device=DEV).bfloat16()
    b = torch.randn(n, hv, generator=g, device=DEV).bfloat16()
    return x, a, b


def _pools(hv):
    g = torch.Generator(device=DEV).manual_seed(1)
    conv = torch.randn(SLOTS, _dim(hv), WIDTH - 1, generator=g, device=DEV).bfloat16()
    ssm = torch.randn(SLOTS, hv, D, D, generator=g, device=DEV) * 0.1
    return conv, ssm


def _eager(kernel, layer, conv, ssm, x, a, b, lens, slots, prefix, track):
    """GDNAttnBackend.forward_extend's plain-extend path, plus its track copies."""
    cu = torch.tensor(
        [0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV
    )
    idx = torch.tensor(slots, dtype=torch.int32, device=DEV)
    has_init = torch.tensor(prefix, device=DEV) > 0
    windows = _eager_conv_windows(x, cu, lens, prefix, track)
    xs = causal_conv1d_fn(
        x.transpose(0, 1),
        layer.conv_weights,
        layer.bias,
        activation=layer.activation,
        conv_states=conv,
        has_initial_state=has_init,
        cache_indices=idx,
        query_start_loc=cu,
        seq_lens_cpu=lens,
    ).transpose(0, 1)[: x.shape[0]]
    q, k, v = fused_qkv_split_gdn_prefill(xs, HK, HK, layer.num_v_heads, D, D, D)
    g, beta = fused_gdn_gating(layer.A_log, a, b, layer.dt_bias)
    if isinstance(kernel, FlashInferGDNKernel):
        # maybe_build_flashinfer_checkpoint_plan: one snapshot after every 64
        # tokens; the state before chunk c is snapshot c - 1 of its row.
        starts = [0, *torch.tensor([n // CHUNK for n in lens]).cumsum(0).tolist()]
        n = starts[-1] if track is not None else 0
        o, _, h = kernel.extend(
            q, k, v, g, beta, ssm_states=ssm, cache_indices=idx, query_start_loc=cu,
            state_checkpoint_cu_starts=torch.tensor(starts, device=DEV) if n else None,
            num_state_checkpoints=n, state_checkpoint_every_n_tokens=CHUNK if n else 0,
        )  # fmt: skip
        chunk_state = lambda row, chunk: h[0, starts[row] + chunk - 1]  # noqa: E731
    else:
        o, _, h = chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=ssm, initial_state_indices=idx,
            cu_seqlens=cu, head_first=False, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        offsets = prepare_chunk_offsets(cu.long(), CHUNK).tolist()
        chunk_state = lambda row, chunk: h[0, offsets[row] + chunk]  # noqa: E731
    if track is not None:
        for row, dst, window in windows:
            conv[dst] = window
        for row, chunk in track.chunk_rows:
            ssm[track.dst[row]] = chunk_state(row, chunk).float()
        for row in track.final_rows:
            ssm[track.dst[row]] = ssm[slots[row]]
    return o


def _eager_conv_windows(x, cu, lens, prefix, track):
    if track is None:
        return []
    total = sum(lens)
    out = []
    for row, aligned in track.conv_rows:
        start = int(cu[row]) + aligned - (WIDTH - 1)
        rows = [min(max(start + j, 0), total - 1) for j in range(WIDTH - 1)]
        out.append((row, int(track.dst[row]), x[rows].transpose(0, 1).clone()))
    return out


def _track_rows(kernel, lens, prefix, mask, dst):
    if isinstance(kernel, FlashInferGDNKernel):
        # sglang's eager FlashInfer plan refuses a track point inside the first
        # chunk ("precedes the first FlashInfer checkpoint"): not tracked here.
        mask = [m and n >= CHUNK for m, n in zip(mask, lens)]
    return build_track_rows(
        track_mask=mask,
        track_seq_lens=[p + n for p, n in zip(prefix, lens)],
        extend_seq_lens=lens,
        extend_prefix_lens=prefix,
        state_chunk_size=CHUNK,
        cache_chunk_size=CHUNK,
        conv_len=WIDTH - 1,
        dst=torch.tensor(dst, dtype=torch.int64, device=DEV),
    )


class _CapturedExtend:
    """One bucket captured once; every batch replays it after a table refill."""

    def __init__(self, kernel, layer, conv, ssm, max_seqs=MAX_SEQS, shared=False):
        self.kernel, self.layer, self.conv, self.ssm = kernel, layer, conv, ssm
        # shared: the forward's first GDN layer (layer 0, on scratch pools) runs
        # before the measured one and builds the tables both read
        # (GDN_TABLES_ONCE_PER_FORWARD); a replay must rebuild them in the graph.
        self.forward_tables = gdn_prefill_graph.ForwardTablesMemo() if shared else None
        self.first_layer = SimpleNamespace(**{**vars(layer), "layer_id": 0})
        self.scratch = conv.clone(), ssm.clone()
        self.meta = KDAPrefillGraphMetadata.allocate(
            num_tokens=BUCKET, max_seqs_cap=max_seqs, track=True,
            cache_index_dtype=torch.int32, device=DEV,
        )  # fmt: skip
        hv = layer.num_v_heads
        self.x = torch.zeros(BUCKET, _dim(hv), dtype=torch.bfloat16, device=DEV)
        self.a = torch.zeros(BUCKET, hv, dtype=torch.bfloat16, device=DEV)
        self.b = torch.zeros(BUCKET, hv, dtype=torch.bfloat16, device=DEV)
        self.prefix = torch.zeros(max_seqs, dtype=torch.int64, device=DEV)
        self.batches = [i for i, b in enumerate(BATCHES) if len(b[0]) <= max_seqs]
        first = BATCHES[self.batches[0]]
        saved = conv.clone(), ssm.clone()
        self.load(*first[:3], None, *_inputs(sum(first[0]), 0, hv))
        real_conv = gdn_prefill_graph.causal_conv1d_fn
        self.cp_calls = 0
        with pytest.MonkeyPatch.context() as patch:
            _count_flashinfer_cp_calls(patch, self)
            # Recorded into the graph: every replay leaves NaN past the batch.
            patch.setattr(
                gdn_prefill_graph,
                "causal_conv1d_fn",
                _conv_leaving_nan_past_the_batch(real_conv),
            )
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._run()  # warm up (JIT, autotune) outside capture
            torch.cuda.current_stream().wait_stream(stream)
            conv.copy_(saved[0]), ssm.copy_(saved[1])
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = self._run()

    def _run(self):
        if self.forward_tables is not None:
            gdn_extend_in_graph(
                layer=self.first_layer, meta=self.meta, conv_states=self.scratch[0],
                ssm_states=self.scratch[1], mixed_qkv=self.x, a=self.a, b=self.b,
                extend_kernel=self.kernel, forward_tables=self.forward_tables,
            )  # fmt: skip
        return gdn_extend_in_graph(
            layer=self.layer, meta=self.meta, conv_states=self.conv,
            ssm_states=self.ssm, mixed_qkv=self.x, a=self.a, b=self.b,
            extend_kernel=self.kernel, forward_tables=self.forward_tables,
        )  # fmt: skip

    def load(self, lens, slots, prefix, track, x, a, b):
        n = x.shape[0]
        # Rows past the batch hold garbage in an engine's bucket buffers: NaN here.
        for buf in (self.x, self.a, self.b):
            buf.fill_(float("nan"))
        self.x[:n], self.a[:n], self.b[:n] = x, a, b
        self.prefix.zero_()
        self.prefix[: len(prefix)] = torch.tensor(prefix, device=DEV)
        self.meta.fill(
            extend_seq_lens=lens,
            cache_indices=torch.tensor(slots, dtype=torch.int32, device=DEV),
            extend_prefix_lens=self.prefix,
            track_rows=track,
        )

    def replay(self, n):
        self.graph.replay()
        return self.out[0, :n]


# flashinfer_reach: FlashInfer's prefill with GDN_FLASHINFER_ZEROES_KERNEL_REACH_ONLY
# (only the rows past the batch that its tiles load are zeroed; the rest stay NaN).
# flashinfer_1slot: FlashInfer's prefill on tables of one request slot (a graph
# over one request slot, which a batch of one request replays; at 32 value heads
# FlashInfer picks its context-parallel algorithm there, as eager does for it),
# with the reach-only zeroing, as both would ship (run with the whole-output
# mask on 2026-12-07d, tree dfff1dc).
# *_track_kernel: the prefix-cache snapshot in one launch of sgl-kernel's
# snapshot_state_rows (GDN_TRACK_SNAPSHOT_KERNEL), on Triton's chunk states and
# on FlashInfer's checkpoints (with the reach-only zeroing, as it ships).
# *_shared_tables: the measured layer reads the tables the forward's first GDN
# layer built in the same graph (GDN_TABLES_ONCE_PER_FORWARD), each replay on
# the batch's refilled tables; and both switches at once.
KERNELS = {
    "triton": lambda: None,
    "flashinfer": FlashInferGDNKernel,
    "flashinfer_reach": FlashInferGDNKernel,
    "flashinfer_1slot": FlashInferGDNKernel,
    "triton_track_kernel": lambda: None,
    "flashinfer_track_kernel": FlashInferGDNKernel,
    "triton_shared_tables": lambda: None,
    "flashinfer_shared_tables": FlashInferGDNKernel,
    "flashinfer_track_kernel_shared_tables": FlashInferGDNKernel,
}
CASES = [(kernel, hv) for kernel in KERNELS for hv in VALUE_HEADS]


@pytest.fixture(scope="module", params=CASES, ids=[f"{k}-hv{h}" for k, h in CASES])
def captured(request):
    name, hv = request.param
    layer = _layer(hv)
    conv, ssm = _pools(hv)
    kernel = KERNELS[name]()
    with pytest.MonkeyPatch.context() as patch:
        # Read while the extend is traced: the captured graph keeps it.
        patch.setattr(
            capability,
            "GDN_FLASHINFER_ZEROES_KERNEL_REACH_ONLY",
            name != "flashinfer",
        )
        patch.setattr(capability, "GDN_TRACK_SNAPSHOT_KERNEL", "_track_kernel" in name)
        max_seqs = 1 if name == "flashinfer_1slot" else MAX_SEQS
        shared = "_shared_tables" in name
        graph = _CapturedExtend(kernel, layer, conv, ssm, max_seqs, shared)
    return layer, graph, f"{name}_hv{hv}"


def _flashinfer_uses_cp(num_seqs, hv) -> bool:
    """FlashInfer's own choice of its context-parallel algorithm (gdn_prefill's
    should_use_cp_host on this GPU)."""
    from flashinfer.gdn_kernels.delta_rule_dsl.varlen_helper import should_use_cp_host
    from flashinfer.utils import (
        get_compute_capability,
        get_device_name,
        get_device_sm_count,
    )

    device = torch.device(DEV)
    return should_use_cp_host(
        num_seqs * hv,
        get_device_sm_count(device),
        get_device_name(device),
        device_capability=get_compute_capability(device),
    )


def _count_flashinfer_cp_calls(patch, graph):
    """Count, on ``graph``, the calls of FlashInfer's SM90 context-parallel
    pipeline while the extend warms up and is captured (which algorithm the
    graph recorded)."""
    from flashinfer import gdn_prefill

    real = gdn_prefill.cp_delta_rule_dsl_sm90
    if real is None:
        return

    def counted(*args, **kwargs):
        graph.cp_calls += 1
        return real(*args, **kwargs)

    patch.setattr(gdn_prefill, "cp_delta_rule_dsl_sm90", counted)


def _conv_leaving_nan_past_the_batch(conv):
    """causal_conv1d_fn whose output rows past the batch are NaN: in an engine
    they hold whatever the graph's memory pool held (no conv block writes them)."""

    def conv_with_garbage(x, *args, query_start_loc, **kwargs):
        out = conv(x, *args, query_start_loc=query_start_loc, **kwargs)
        tokens = torch.arange(out.shape[-1], device=out.device)
        return out.masked_fill(tokens >= query_start_loc[-1], float("nan"))

    return conv_with_garbage


def _run_batch(layer, captured, batch_id, corrupt=None):
    lens, slots, prefix, mask, dst = BATCHES[batch_id]
    hv = layer.num_v_heads
    x, a, b = _inputs(sum(lens), batch_id, hv)
    conv0, ssm0 = _pools(hv)
    track = _track_rows(captured.kernel, lens, prefix, mask, dst)
    conv_e, ssm_e = conv0.clone(), ssm0.clone()
    ref = _eager(
        captured.kernel, layer, conv_e, ssm_e, x, a, b, lens, slots, prefix, track
    )[0]
    captured.conv.copy_(conv0), captured.ssm.copy_(ssm0)
    captured.load(lens, slots, prefix, track, x, a, b)
    if corrupt is not None:
        corrupt(captured.meta)
    out = captured.replay(sum(lens))
    return {
        "output": (out.float() - ref.float()).abs().max().item(),
        "output_scale": ref.float().abs().max().item(),
        # Slot 0 is the reserved padding slot: untracked rows' conv snapshot
        # writes land there; no replay writes its ssm state (padding request
        # slots move no state), so it must hold what it held before.
        "conv_state": (captured.conv[1:].float() - conv_e[1:].float())
        .abs()
        .max()
        .item(),
        "ssm_state": (captured.ssm[1:] - ssm_e[1:]).abs().max().item(),
        "padding_slot_finite": bool(torch.isfinite(captured.ssm[0]).all()),
        "padding_slot_untouched": torch.equal(captured.ssm[0], ssm0[0]),
        "tracked_rows": 0 if track is None else len(track.conv_rows),
        **(
            {
                "flashinfer_cp": {
                    "graph": _flashinfer_uses_cp(captured.meta.max_seqs, hv),
                    "graph_captured_cp": captured.cp_calls > 0,
                    "eager": _flashinfer_uses_cp(len(lens), hv),
                }
            }
            if isinstance(captured.kernel, FlashInferGDNKernel)
            else {}
        ),
    }


def test_replayed_graph_matches_eager_extend(captured):
    layer, graph, kernel = captured
    diffs = {f"batch{i}": _run_batch(layer, graph, i) for i in graph.batches}
    write_result(
        f"gdn_extend_kernel_{kernel}",
        {
            "kernel": kernel,
            "bucket": BUCKET,
            "max_seqs": graph.meta.max_seqs,
            "max_abs_diff": diffs,
        },
    )
    for d in diffs.values():
        assert d["output"] <= 2e-2 * max(1.0, d["output_scale"]), d
        assert d["conv_state"] <= 2e-2 and d["ssm_state"] <= 2e-2, d
        assert d["padding_slot_untouched"], d
        if "flashinfer_cp" in d:  # the algorithm recorded is the one expected
            cp = d["flashinfer_cp"]
            assert cp["graph_captured_cp"] == cp["graph"], d


def test_wrong_state_slot_is_detected(captured):
    """Can-fail control: the same replay pointed at the padding state slot."""
    layer, graph, kernel = captured
    d = _run_batch(
        layer,
        graph,
        graph.batches[0],
        corrupt=lambda m: m.cache_indices.masked_fill_(m.cache_indices >= 0, 0),
    )
    write_result(f"gdn_extend_kernel_{kernel}_wrong_state", {"max_abs_diff": d})
    assert d["output"] > 2e-2 * max(1.0, d["output_scale"]) or d["ssm_state"] > 2e-2, d
