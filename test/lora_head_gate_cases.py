"""Cases for sgl-kernel's add_lora_head_gate_delta_ on the batch info that
sglang's own LoRA backends (csgmv, triton) prepare: eager and prefill-graph
buffers, two adapters of different ranks and scalings,
requests without an adapter, graph padding rows. Shared by the CPU test (Triton's
interpreter, test/unit/sgl_kernel/interpret_lora_head_gate.py) and the GPU test
(test/gpu/test_lora_head_gate_kernel.py)."""

from types import SimpleNamespace
from unittest import mock

import torch

from sglang.srt.lora.backend import chunked_backend
from sglang.srt.lora.backend.chunked_backend import ChunkedSgmvLoRABackend
from sglang.srt.lora.backend.triton_backend import TritonLoRABackend
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang_graphfix_kernel.lora_head_gate import (
    add_lora_head_gate_delta_,
    lora_head_gate,
    request_segments,
)

MAX_LORAS = 3  # slot 0 holds no adapter (rank 0), as sglang's pool does


def lora_backend(name, device, chunk=16, slots=MAX_LORAS):
    """sglang's csgmv or triton LoRA backend with ``slots`` pool slots."""
    if name == "triton":
        return TritonLoRABackend(slots, device)
    # ChunkedSgmvLoRABackend.__init__ reads the published --max-lora-chunk-size.
    lora_args = SimpleNamespace(max_lora_chunk_size=chunk)
    with mock.patch.object(chunked_backend, "get_lora", lambda: lora_args):
        return ChunkedSgmvLoRABackend(slots, device, None)


def prepare_batch(backend, requests, adapters, *, graph):
    """LoRAManager.prepare_lora_batch's steps for an EXTEND batch: the backend's
    prepare_lora_batch (into its prefill-graph buffers when ``graph``), then the
    host-side flags the manager sets after it. requests: [(tokens, slot)];
    adapters: {slot: (rank, scaling)}."""
    lens = [n for n, _ in requests]
    ranks = [0] * backend.max_loras_per_batch
    scalings = [0.0] * backend.max_loras_per_batch
    for slot, (rank, scaling) in adapters.items():
        ranks[slot], scalings[slot] = rank, scaling
    backend.prepare_lora_batch(
        SimpleNamespace(
            forward_mode=ForwardMode.EXTEND,
            batch_size=len(requests),
            extend_seq_lens_cpu=lens,
            extend_seq_lens=torch.tensor(
                lens, dtype=torch.int32, device=backend.device
            ),
            extend_num_tokens=sum(lens),
            spec_info=None,
            return_logprob=False,
        ),
        [slot for _, slot in requests],
        ranks,
        scalings,
        use_cuda_graph=False,
        use_prefill_cuda_graph=graph,
    )
    backend.batch_info.has_active_lora = any(ranks[s] > 0 for _, s in requests)
    backend.batch_info.is_prefill = True


def prepare(backend_name, graph, requests, adapters, chunk=16, rows=None, device="cpu"):
    """A new backend with its batch info prepared as the LoRA manager does: the
    prefill-graph buffers (sized for ``rows`` tokens) or an eager batch info."""
    backend = lora_backend(backend_name, torch.device(device), chunk)
    if graph:
        backend.init_prefill_cuda_graph_batch_info(rows, max_num_requests=8)
    prepare_batch(backend, requests, adapters, graph=graph)
    return backend


def run(
    backend_name,
    graph,
    requests,
    adapters,
    max_rank,
    chunk=16,
    rows=None,
    *,
    k=256,
    n=64,
    device="cpu",
    dtype=torch.half,
    unfused=False,
    kernel_kwargs=None,
    full=False,
):
    """requests: [(tokens, slot)]; adapters: {slot: (rank, scaling)}; rows: the
    padded token count (a graph bucket). unfused: also compare with sglang's own
    shrink + expand on the same batch info (needs its Triton kernels). full: the
    whole gate (lora_head_gate) with a weight W, base x Wᵀ, instead of the delta
    added to a given base."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(0)
    tokens = sum(t for t, _ in requests)
    rows = rows or tokens
    x = torch.randn(rows, k, generator=g).to(device, dtype)
    a = torch.zeros(MAX_LORAS, max_rank, k, dtype=dtype)
    b = torch.zeros(MAX_LORAS, n, max_rank, dtype=dtype)
    for slot, (rank, _) in adapters.items():
        a[slot, :rank] = torch.randn(rank, k, generator=g) / k**0.5
        b[slot, :, :rank] = torch.randn(n, rank, generator=g)
    a, b = a.to(device), b.to(device)
    base = torch.randn(rows, n, generator=g).to(device)
    if full:
        weight = (torch.randn(n, k, generator=g) / k**0.5).to(device, dtype)
        base = x.float() @ weight.float().t()
    backend = prepare(backend_name, graph, requests, adapters, chunk, rows, device)
    info = backend.get_batch_info()

    def reference(adapter_of):
        """fp32 x Wᵀ-free delta s·(x Aᵀ) Bᵀ, x Aᵀ rounded to the input dtype as
        sglang's kernels do, added to the base."""
        ref, start, with_adapter = base.clone(), 0, []
        for t, slot in requests:
            if adapter_of(slot) in adapters:
                rank, scaling = adapters[adapter_of(slot)]
                aa, bb = a[adapter_of(slot), :rank], b[adapter_of(slot), :, :rank]
                xa = (x[start : start + t].float() @ aa.float().t()).to(dtype)
                ref[start : start + t] += scaling * (xa.float() @ bb.float().t())
                with_adapter += range(start, start + t)
            start += t
        return ref, torch.tensor(with_adapter, dtype=torch.long, device=device)

    if full:
        out = lora_head_gate(x, weight, a, b, info, **(kernel_kwargs or {}))
    else:
        out = add_lora_head_gate_delta_(
            base.clone(), x, a, b, info, **(kernel_kwargs or {})
        )
    ref, adapter_rows = reference(lambda slot: slot)
    others = torch.ones(rows, dtype=torch.bool, device=device)
    others[adapter_rows] = False
    scale = ref[adapter_rows].abs().max()
    # The same output against the adapters swapped (slot 1 <-> 2): shows the
    # comparison can fail.
    swapped, _ = reference(lambda slot: {1: 2, 2: 1}.get(slot, slot))
    result = {
        "requests": int(request_segments(info)[2]),
        "adapter_rows": int(adapter_rows.numel()),
        "adapter_rows_max_rel_error": float(
            (out - ref)[adapter_rows].abs().max() / scale
        ),
        "other_rows_bit_identical": bool(torch.equal(out[others], base[others])),
        "other_rows_max_rel_error": float(
            (out - base)[others].abs().max() / base[others].abs().max()
        ),
        "swapped_adapters_max_rel_error": float(
            (out - swapped)[adapter_rows].abs().max() / scale
        ),
    }
    if unfused:
        offset = torch.tensor([0, n], dtype=torch.int32, device=device)
        xa = backend.run_lora_a_sgemm(x, a)
        sglang = backend.run_lora_b_sgemm(
            x=xa, weights=b, output_offset=offset, base_output=base.clone()
        )
        result["vs_sglang_unfused_adapter_rows_max_rel_error"] = float(
            (out - sglang)[adapter_rows].abs().max() / scale
        )
    return result


# 70 tokens; csgmv splits them into chunks of 16 (in adapter order), which the
# kernel does not use; slot 0 requests have no adapter.
REQUESTS = [(37, 1), (3, 0), (20, 2), (1, 1), (9, 0)]


def case(backend, graph, max_rank, requests=REQUESTS, rows=None):
    name = f"{backend}-{'graph' if graph else 'eager'}-rank{max_rank}"
    tokens = sum(t for t, _ in requests)
    return name, dict(
        backend_name=backend,
        graph=graph,
        requests=requests,
        adapters={1: (max_rank // 2, 2.0), 2: (max_rank, 0.5)},
        max_rank=max_rank,
        # The graph's padded token bucket.
        rows=(rows or tokens + 10) if graph else None,
    )


CASES = dict(
    case(backend, graph, max_rank)
    for backend in ("triton", "csgmv")
    for graph in (False, True)
    for max_rank in (16, 64)
)


# The kernel calls each case runs: the delta into a given base (split-K chosen,
# none, 4; short batches split by default, split_k=1 is what long prompts take)
# and the whole gate (base + delta), split K and not.
VARIANTS = {
    "split-auto": {},
    "split-1": {"kernel_kwargs": {"split_k": 1}},
    "split-4": {"kernel_kwargs": {"split_k": 4}},
    "full-split-auto": {"full": True},
    "full-split-1": {"full": True, "kernel_kwargs": {"split_k": 1}},
}
