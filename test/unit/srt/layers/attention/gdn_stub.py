"""A GDN backend and the full prefill runner's capture batch, as CPU stand-ins
(GDNAttnBackend.__init__ needs a model runner on a GPU)."""

from types import SimpleNamespace

import torch

from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
from sglang.srt.model_executor.forward_batch_info import ForwardMode

BUCKET, SLOTS_PER_GRAPH, WINDOW, CHUNK = 256, 4, 3, 64
# Request-pool row -> mamba slot; row 0 is the padding row.
MAPPING = [0, 5, 9, 2, 7]


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
        req_pool_indices=torch.arange(SLOTS_PER_GRAPH),
        extend_prefix_lens=torch.zeros(SLOTS_PER_GRAPH, dtype=torch.int64),
        mamba_track_mask=torch.zeros(SLOTS_PER_GRAPH, dtype=torch.bool),
        mamba_track_indices=torch.zeros(SLOTS_PER_GRAPH, dtype=torch.int64),
    )
