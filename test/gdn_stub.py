"""A GDN backend and the full prefill runner's capture and replay batches, as CPU
stand-ins (GDNAttnBackend.__init__ needs a model runner on a GPU)."""

import types
from types import SimpleNamespace

import torch

from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

BUCKET, SLOTS_PER_GRAPH, WINDOW, CHUNK = 256, 4, 3, 64
# Request-pool row -> mamba slot; row 0 is the padding row.
MAPPING = [0, 5, 9, 2, 7]
# The live batch replayed on the bucket: 3 requests (row 1 has a prefix), all with
# prefix-cache tracking: row 0 unaligned in its first chunk, row 1 chunk-aligned
# (64 tokens), row 2 unaligned.
LENS, PREFIX, TRACK_SEQ_LENS = [37, 100, 110], [0, 10, 3], [37, 74, 113]
TRACKED, TRACK_DST = [True, True, True], [10, 11, 12]


class _Pool:
    """req_to_token_pool stand-in: a row->slot map, identity virtual->physical."""

    enable_mamba_extra_buffer = True

    def get_mamba_indices(self, rows):
        return torch.tensor(MAPPING, dtype=torch.int32)[rows]

    def translate_mamba_indices(self, indices):
        return indices


def make_gdn(extend_kernel=None, enable_mis=False):
    backend = GDNAttnBackend.__new__(GDNAttnBackend)
    backend.req_to_token_pool = _Pool()
    backend.device = torch.device("cpu")
    backend.kernel_dispatcher = SimpleNamespace(
        extend_kernel=extend_kernel or TritonGDNKernel()
    )
    backend.enable_mis = enable_mis
    backend.conv_states_shape = (3, len(MAPPING), 1024, WINDOW)
    backend._mamba_chunk_size = CHUNK
    return backend


def capture_view():
    """What PrefillCudaGraphRunner.capture_prepare builds for a full graph."""
    return SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        input_ids=torch.zeros(BUCKET, dtype=torch.int64),
        batch_size=SLOTS_PER_GRAPH,
        extend_seq_lens_cpu=[BUCKET, 0, 0, 0],
        extend_seq_lens=torch.tensor([BUCKET, 0, 0, 0]),
        req_pool_indices=torch.arange(SLOTS_PER_GRAPH),
        extend_prefix_lens=torch.zeros(SLOTS_PER_GRAPH, dtype=torch.int64),
        mamba_track_mask=torch.zeros(SLOTS_PER_GRAPH, dtype=torch.bool),
        mamba_track_indices=torch.zeros(SLOTS_PER_GRAPH, dtype=torch.int64),
        mamba_track_seqlens=torch.zeros(SLOTS_PER_GRAPH, dtype=torch.int64),
    )


def live_batch():
    """The scheduler's ForwardBatch for LENS (the fields the tables read)."""
    batch = SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        batch_size=len(LENS),
        extend_num_tokens=sum(LENS),
        extend_seq_lens_cpu=LENS,
        extend_seq_lens=torch.tensor(LENS),
        extend_prefix_lens_cpu=PREFIX,
        extend_prefix_lens=torch.tensor(PREFIX),
        req_pool_indices=torch.tensor([1, 2, 3]),
        mamba_track_mask=torch.tensor(TRACKED),
        mamba_track_seqlens=torch.tensor(TRACK_SEQ_LENS),
        mamba_track_indices=torch.tensor(TRACK_DST),
        mamba_prefill_track_mask_cpu=TRACKED,
        mamba_track_seqlens_cpu=TRACK_SEQ_LENS,
        _original_batch_size=None,
    )
    batch.mamba_track_aligned_lens = types.MethodType(
        ForwardBatch.mamba_track_aligned_lens, batch
    )
    return batch


def live_batch_without_first_chunk_track(track_row0=False):
    """live_batch with its row 0 (tracked inside its first chunk, which sglang's
    eager FlashInfer checkpoint plan refuses) untracked unless ``track_row0``."""
    live = live_batch()
    live.mamba_prefill_track_mask_cpu = [track_row0, *TRACKED[1:]]
    live.mamba_track_mask = torch.tensor(live.mamba_prefill_track_mask_cpu)
    return live


def replay_view(live):
    """PrefillCudaGraphRunner._prepare_forward_metadata_for_replay's padded view:
    request slots padded to the capture's with pool row 0 and zero lengths, the
    real CPU lists."""
    view = SimpleNamespace(**vars(live))
    view.batch_size = SLOTS_PER_GRAPH
    view.input_ids = torch.zeros(BUCKET, dtype=torch.int64)
    view.req_pool_indices = torch.tensor([1, 2, 3, 0])
    view.extend_prefix_lens = torch.tensor([*PREFIX, 0])
    view.extend_seq_lens = torch.tensor([*LENS, 0])
    return view
