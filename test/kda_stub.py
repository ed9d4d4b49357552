"""A KDA backend as a CPU stand-in, and the CUDA-graph fields the linear
backends' __init__ would set (KDAAttnBackend.__init__ needs a model runner on a
GPU)."""

from types import SimpleNamespace

from gdn_stub import make_gdn

from sglang.kernels.ops.mamba.causal_conv1d_triton import PAD_SLOT_ID
from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend
from sglang.srt.layers.attention.linear.kernels.kda_triton import TritonKDAKernel


def make_kda(extend_kernel=None):
    """GDN's stand-in pool (row -> slot map), device and conv window, on a real
    KDAAttnBackend with the Triton extend kernel."""
    kda = KDAAttnBackend.__new__(KDAAttnBackend)
    gdn = make_gdn()
    kda.req_to_token_pool, kda.device = gdn.req_to_token_pool, gdn.device
    kda.conv_states_shape = gdn.conv_states_shape  # [..., dim, kernel - 1]
    kda._mamba_chunk_size = gdn._mamba_chunk_size
    kda.kernel_dispatcher = SimpleNamespace(
        extend_kernel=extend_kernel or TritonKDAKernel()
    )
    kda.prefill_graph_max_seqs = 128  # SGLANG_KDA_PREFILL_GRAPH_MAX_SEQS default
    return kda


def with_graph_lists(backend):
    """The per-batch-size CUDA-graph fields MambaAttnBackendBase.__init__ sets."""
    backend.pad_slot_id = PAD_SLOT_ID
    backend.state_indices_list = []
    backend.query_start_loc_list = []
    backend.retrieve_next_token_list = []
    backend.retrieve_next_sibling_list = []
    backend.retrieve_parent_token_list = []
    backend.replayssm_write_pos_list = None
    backend.replayssm_force_flush_list = None
    backend.mamba_track_indices_buf = None
    backend._fused_state_indices_ok = False  # the fused path is CUDA-only
    backend._graph_seq_len_fill_value = 1
    backend.topk = 0
    return backend
