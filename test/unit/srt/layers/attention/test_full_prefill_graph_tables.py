"""The full prefill graph's linear-attention tables, filled on the device: the
same tables as sglang's host fill (KDAPrefillGraphMetadata.fill with
build_track_rows) for random replay batches, through our full_prefill_graph_tables
on sglang's GDN backend; and the replay path's host work does not grow with the
number of requests (no host read of device data, the same Python calls for one
request or 32), where sglang's host fill does (the control).

The Triton kernel itself is checked in Triton's interpreter
(test/unit/sgl_kernel/test_linear_prefill_tables.py); here, off CUDA, the fill
takes its torch steps."""

import sys
from types import SimpleNamespace

import linear_prefill_table_cases as cases
import pytest
import torch
from gdn_stub import CHUNK, make_gdn

from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang_graphfix.srt.layers.attention.linear import kda_prefill_graph as ours
from sglang_graphfix_kernel import linear_prefill_tables


@pytest.mark.parametrize("seed", range(150))
def test_device_fill_equals_sglangs_host_fill(seed):
    assert cases.mismatches(cases.make_case(seed)) == []


@pytest.mark.parametrize("bucket, slots", [(16, 4), (256, 1), (8, 32)])
def test_capture_batch_fills_like_sglang(bucket, slots):
    assert cases.mismatches(cases.capture_case(bucket, slots)) == []


def test_a_wrong_fill_is_caught():
    """The comparison can fail: a one-token shift of one request."""
    case = cases.make_case(5)
    wrong = dict(case, lens=[case["lens"][0] + 1, *case["lens"][1:]])
    host, dev = cases.host_tables(case), cases.device_tables(wrong)
    assert not torch.equal(host.cu_seqlens, dev.cu_seqlens)


# --- through full_prefill_graph_tables on sglang's GDN backend ---------------

SLOTS, BUCKET = 32, 1024
POOL = 64


class _Pool:
    enable_mamba_extra_buffer = True

    def get_mamba_indices(self, rows):
        return rows.to(torch.int32) + 100  # pool row -> mamba slot

    def translate_mamba_indices(self, indices):
        return indices


def _gdn():
    backend = make_gdn()
    backend.req_to_token_pool = _Pool()
    return backend


def _capture(backend):
    zeros = torch.zeros(SLOTS, dtype=torch.int64)
    view = SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        input_ids=torch.zeros(BUCKET, dtype=torch.int64),
        batch_size=SLOTS,
        extend_seq_lens_cpu=[BUCKET] + [0] * (SLOTS - 1),
        extend_seq_lens=torch.tensor([BUCKET] + [0] * (SLOTS - 1)),
        extend_prefix_lens=zeros,
        req_pool_indices=torch.arange(SLOTS),
        mamba_track_mask=torch.zeros(SLOTS, dtype=torch.bool),
        mamba_track_seqlens=zeros,
        mamba_track_indices=zeros,
    )
    return ours.full_prefill_graph_tables(backend, view, in_capture=True, family="GDN")


def _replay_view(bs, seed=0):
    """PrefillCudaGraphRunner._prepare_forward_metadata_for_replay's padded view
    of a bs-request batch with prefixes and snapshots."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, BUCKET // SLOTS, (bs,), generator=g)
    prefix = torch.randint(0, 3, (bs,), generator=g) * CHUNK
    pad = SLOTS - bs

    def padded(t):
        return torch.cat([t, torch.zeros(pad, dtype=t.dtype)])

    return (
        SimpleNamespace(
            forward_mode=ForwardMode.EXTEND,
            input_ids=torch.zeros(BUCKET, dtype=torch.int64),
            batch_size=SLOTS,
            extend_seq_lens_cpu=lens.tolist(),
            extend_prefix_lens_cpu=prefix.tolist(),
            extend_seq_lens=padded(lens),
            extend_prefix_lens=padded(prefix),
            req_pool_indices=padded(torch.randperm(POOL, generator=g)[:bs] + 1),
            mamba_track_mask=torch.rand(bs, generator=g) < 0.5,
            mamba_prefill_track_mask_cpu=None,
            mamba_track_seqlens=prefix + torch.randint(0, 2, (bs,), generator=g) * lens,
            mamba_track_seqlens_cpu=None,
            mamba_track_indices=torch.randint(200, 300, (bs,), generator=g),
        ),
        lens,
        prefix,
    )


def test_replay_tables_through_our_hook_equal_sglangs_host_fill():
    backend = _gdn()
    _capture(backend)
    for bs in (1, 3, SLOTS):
        view, lens, prefix = _replay_view(bs, seed=bs)
        meta = ours.full_prefill_graph_tables(
            backend, view, in_capture=False, family="GDN"
        )
        case = dict(
            bucket=BUCKET,
            slots=SLOTS,
            lens=lens.tolist(),
            prefix=prefix.tolist(),
            mask=view.mamba_track_mask.tolist(),
            track_lens=view.mamba_track_seqlens.tolist(),
            state_chunk=CHUNK,
            cache_chunk=CHUNK,
            mamba_slots=(view.req_pool_indices[:bs] + 100).tolist(),
            track_dst=view.mamba_track_indices.tolist(),
        )
        host = cases.host_tables(case)
        for field in cases.FIELDS:
            assert torch.equal(getattr(meta, field), getattr(host, field)), (bs, field)


# --- host work on the replay path --------------------------------------------

_SYNCS = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__",
          "__index__", "pin_memory")  # fmt: skip


class _Recorder:
    """Counts host reads of tensor data and every Python / C call made."""

    def __init__(self, monkeypatch):
        self.syncs = []
        for name in _SYNCS:
            original = getattr(torch.Tensor, name)

            def counted(self_, *args, _name=name, _original=original, **kwargs):
                self.syncs.append(_name)
                return _original(self_, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)

    def calls(self, fn):
        count = [0]

        def profile(frame, event, arg):
            if event in ("call", "c_call"):
                count[0] += 1

        self.syncs.clear()
        sys.setprofile(profile)
        try:
            fn()
        finally:
            sys.setprofile(None)
        return count[0]


@pytest.fixture
def launch_path(monkeypatch):
    """The CUDA path: one kernel launch (recorded here, not run)."""
    launches = []

    class _Launch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((grid, args, kwargs))

    monkeypatch.setattr(linear_prefill_tables, "_interpreting", lambda: True)
    monkeypatch.setattr(linear_prefill_tables, "_fill_linear_prefill_tables", _Launch())
    return launches


def test_replay_host_work_does_not_grow_with_requests(monkeypatch, launch_path):
    backend = _gdn()
    _capture(backend)
    views = {bs: _replay_view(bs)[0] for bs in (1, 8, SLOTS)}
    recorder = _Recorder(monkeypatch)
    counts, syncs = {}, {}
    for bs, view in views.items():
        launch_path.clear()
        counts[bs] = recorder.calls(
            lambda: ours.full_prefill_graph_tables(
                backend, view, in_capture=False, family="GDN"
            )
        )
        syncs[bs] = list(recorder.syncs)
        assert len(launch_path) == 1 and launch_path[0][0] == (1,)
        args = launch_path[0][1]
        assert args[6 + len(linear_prefill_tables.TableViews._fields)] == bs
    assert syncs == {bs: [] for bs in views}  # nothing reads device data
    print("replay calls per request count", counts)
    assert counts[1] == counts[8] == counts[SLOTS], counts


def test_control_sglangs_host_fill_grows_with_requests(monkeypatch):
    """The same count on sglang's host fill (the replay path before): more calls
    with more requests, and host copies, so the measurement above can fail."""
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    recorder = _Recorder(monkeypatch)
    counts = {}
    for bs in (1, SLOTS):
        view, lens, prefix = _replay_view(bs)
        case = dict(
            bucket=BUCKET, slots=SLOTS, lens=lens.tolist(), prefix=prefix.tolist(),
            mask=view.mamba_track_mask.tolist(),
            track_lens=view.mamba_track_seqlens.tolist(),
            state_chunk=CHUNK, cache_chunk=CHUNK, mamba_slots=list(range(1, bs + 1)),
            track_dst=view.mamba_track_indices.tolist(),
        )  # fmt: skip
        meta = cases.allocate(case, "cpu", track=True)
        counts[bs] = recorder.calls(lambda: cases.host_fill(meta, case, "cpu"))
        assert "pin_memory" in recorder.syncs
    print("host fill calls per request count", counts)
    assert counts[SLOTS] > counts[1], counts
