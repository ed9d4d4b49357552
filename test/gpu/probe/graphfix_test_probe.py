"""Test-only sglang plugin, found through the dist-info beside it (test/gpu puts
this folder on PYTHONPATH for the engine processes).

Counts, in files under GRAPHFIX_PROBE_DIR (one byte per event):
  gdn_graph_capture / gdn_graph_replay   GDN full prefill graph tables filled
                                         for a capture / before a replay
  kda_graph_capture / kda_graph_replay   the same for KDA (Kimi-Linear)
  mamba2_graph_capture / mamba2_graph_replay
                                         the same for Mamba2 (the bucket's
                                         Mamba2FullGraphMetadata refilled)
  short_conv_graph_capture / short_conv_graph_replay
                                         the same for LFM2's short conv
  <family>_graph_replay_slots<R>         a replay's tables have R request slots
                                         (fewer than the runner's: a request
                                         bucket's graph)
  graph_replay_request_slots<R>          FullCudaGraphBackend.replay of a graph
                                         filed under request bucket R
  dsa_lora_head_gate                     Indexer._get_logits_head_gate with a
                                         LoRA-owned weights_proj (only the graph
                                         split op calls it so)
  dsa_lora_merged / dsa_lora_full_gate / dsa_lora_delta
                                         which path that gate took: upstream's
                                         GEMM on the merged weight (one adapter
                                         for every request), sgl-kernel's whole
                                         gate (every request with an adapter,
                                         several adapters) or its delta on cuBLAS
  graphfix_absent / graphfix_present     with GRAPHFIX_PROBE_UPSTREAM=1: whether
                                         this process runs without sglang-graphfix
                                         (the upstream baseline)
Faults (GRAPHFIX_PROBE_FAULT), each pointing every real request of a graph
replay at the padding state slot (a wrong state-index table), so the tests can
show their comparison fails: gdn_wrong_state (GDN), kda_wrong_state (KDA),
short_conv_wrong_state (LFM2: the tables' cache_indices),
mamba2_wrong_state (Mamba2: the tables' cache_indices, which the conv and the
SSD read initial states from and write final states to, and the final-state
snapshot copies from; a request stays consistent with itself across its
chunks, so the wrong state shows in its decode, which reads the request's own,
never-written slot).
GRAPHFIX_PROBE_FLASHINFER_GDN_CAPTURE_SM=<sm>,
GRAPHFIX_PROBE_MAMBA2_FULL_PREFILL_GRAPH=1,
GRAPHFIX_PROBE_MAMBA2_LAYER_GAPS_CAPTURED=1 and
GRAPHFIX_PROBE_NEMOTRON_H_MOE_LAYERS_CAPTURED=1 and
GRAPHFIX_PROBE_LFM2_FULL_PREFILL_GRAPH=1 and
GRAPHFIX_PROBE_MAMBA2_FULL_BEATS_BREAKABLE=1 (a full graph on Falcon-H1 and
NemotronH of Mamba2 and attention layers only stays full) and
GRAPHFIX_PROBE_MAMBA2_REQUEST_BUCKETS_CAPTURED=1 and
GRAPHFIX_PROBE_MAMBA2_CONV_BLOCK_TABLE=1 and
GRAPHFIX_PROBE_MAMBA2_TABLE_FILL_KERNEL=1 and
GRAPHFIX_PROBE_MAMBA2_SNAPSHOT_KERNEL=1 and
GRAPHFIX_PROBE_GDN_SINGLE_REQUEST_GRAPHS=1 and
GRAPHFIX_PROBE_GDN_TRACK_SNAPSHOT_KERNEL=1 and
GRAPHFIX_PROBE_GDN_TABLES_ONCE_PER_FORWARD=1 set those switches, and
GRAPHFIX_PROBE_MAMBA2_GROUPS=1,8 the group counts of MAMBA2_CHECKED, and
GRAPHFIX_PROBE_REQUEST_BUCKET_MAX_TOKENS=<n> the largest token bucket with request
buckets (a measurement: request buckets for long prompts too), and
GRAPHFIX_PROBE_MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS=<n> the largest token bucket
with a graph over one request slot, and
GRAPHFIX_PROBE_MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST=<n> the tokens per request above
which a Mamba2 full graph's batch runs eager, of
full_prefill_graph_capability in every process that loads the plugins (set them
before the test process's first engine, whose resolution judges Mamba2 too; a
test that needs the switch in its own process whatever ran before sets the
module attribute itself, as test_mamba2_full_prefill_graph does), for the tests
of the switched-off paths.
GRAPHFIX_PROBE_GRAPH_MEMORY=1: after sglang captures the prefill graphs
(cuda_graph_setup.capture_prefill_graph), one WARNING line in the server's log,
"graphfix probe: prefill graph memory {json}": the device memory the capture
took (free memory before and after), how much more the caching allocator
reserved (the graphs' pool, and whatever the capture's warm-up forwards left
cached; sglang empties the cache inside the call, before its own reading) and
allocated, the rest outside it (graph objects, library workspaces, kernels
loaded), and the graphs captured, with "held_after_capture": the device tensors
Python holds after the capture that it did not hold before (found by a walk of
the garbage collector's objects; views counted once per storage), grouped by
shape and dtype, the largest first (what the graphs keep allocated: their
outputs, attention metadata; tensors only C++ holds are not seen)
(benchmark/serving_prefill_graph.py keeps it among the server's facts).
"""

import os


def _bump(name):
    with open(os.path.join(os.environ["GRAPHFIX_PROBE_DIR"], name), "ab") as f:
        f.write(b".")


def register():
    if not os.environ.get("GRAPHFIX_PROBE_DIR"):
        return
    if os.environ.get("GRAPHFIX_PROBE_UPSTREAM"):
        _record_upstream()
        return
    import sglang_graphfix

    sglang_graphfix.register()  # wrap on top of the real patches

    from sglang_graphfix.srt import full_prefill_graph_capability as capability

    capture_sm = os.environ.get("GRAPHFIX_PROBE_FLASHINFER_GDN_CAPTURE_SM")
    if capture_sm:
        capability.FLASHINFER_GDN_CAPTURE_SM = int(capture_sm)
    if os.environ.get("GRAPHFIX_PROBE_MAMBA2_FULL_PREFILL_GRAPH"):
        capability.MAMBA2_FULL_PREFILL_GRAPH = True
    if os.environ.get("GRAPHFIX_PROBE_MAMBA2_LAYER_GAPS_CAPTURED"):
        capability.MAMBA2_LAYER_GAPS_CAPTURED = True
    if os.environ.get("GRAPHFIX_PROBE_NEMOTRON_H_MOE_LAYERS_CAPTURED"):
        capability.NEMOTRON_H_MOE_LAYERS_CAPTURED = True
    if os.environ.get("GRAPHFIX_PROBE_LFM2_FULL_PREFILL_GRAPH"):
        capability.LFM2_FULL_PREFILL_GRAPH = True
    if os.environ.get("GRAPHFIX_PROBE_MAMBA2_FULL_BEATS_BREAKABLE"):
        capability.MAMBA2_FULL_BEATS_BREAKABLE = True
    if os.environ.get("GRAPHFIX_PROBE_MAMBA2_REQUEST_BUCKETS_CAPTURED"):
        capability.MAMBA2_REQUEST_BUCKETS_CAPTURED = True
    if os.environ.get("GRAPHFIX_PROBE_MAMBA2_CONV_BLOCK_TABLE"):
        capability.MAMBA2_CONV_BLOCK_TABLE = True
    if os.environ.get("GRAPHFIX_PROBE_MAMBA2_TABLE_FILL_KERNEL"):
        capability.MAMBA2_TABLE_FILL_KERNEL = True
    if os.environ.get("GRAPHFIX_PROBE_MAMBA2_SNAPSHOT_KERNEL"):
        capability.MAMBA2_SNAPSHOT_KERNEL = True
    if os.environ.get("GRAPHFIX_PROBE_GDN_SINGLE_REQUEST_GRAPHS"):
        capability.GDN_SINGLE_REQUEST_GRAPHS = True
    if os.environ.get("GRAPHFIX_PROBE_GDN_TRACK_SNAPSHOT_KERNEL"):
        capability.GDN_TRACK_SNAPSHOT_KERNEL = True
    if os.environ.get("GRAPHFIX_PROBE_GDN_TABLES_ONCE_PER_FORWARD"):
        capability.GDN_TABLES_ONCE_PER_FORWARD = True
    request_bucket_max = os.environ.get("GRAPHFIX_PROBE_REQUEST_BUCKET_MAX_TOKENS")
    if request_bucket_max:
        capability.REQUEST_BUCKET_MAX_TOKENS = int(request_bucket_max)
    single = os.environ.get("GRAPHFIX_PROBE_MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS")
    if single:
        capability.MAMBA2_SINGLE_REQUEST_GRAPH_MAX_TOKENS = int(single)
    per_request = os.environ.get("GRAPHFIX_PROBE_MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST")
    if per_request:
        capability.MAMBA2_GRAPH_MAX_TOKENS_PER_REQUEST = int(per_request)
    groups = os.environ.get("GRAPHFIX_PROBE_MAMBA2_GROUPS")
    if groups:
        capability.MAMBA2_CHECKED["groups"] = tuple(map(int, groups.split(",")))

    if os.environ.get("GRAPHFIX_PROBE_GRAPH_MEMORY"):
        _measure_prefill_graph_memory()

    from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer
    from sglang_graphfix.srt.layers.attention import (
        hybrid_linear_attn_backend as hybrid,
    )
    from sglang_graphfix.srt.layers.attention.dsa.dsa_indexer import (
        weights_proj_has_lora,
    )

    fault = os.environ.get("GRAPHFIX_PROBE_FAULT")
    for family, name in (
        ("gdn", "prepare_full_prefill_graph_tables"),
        ("kda", "prepare_kda_full_prefill_graph_tables"),
        ("mamba2", "prepare_mamba2_full_prefill_graph_metadata"),
        ("short_conv", "prepare_short_conv_full_prefill_graph_tables"),
    ):
        setattr(
            hybrid,
            name,
            _counted_fill(
                getattr(hybrid, name), family, fault == f"{family}_wrong_state"
            ),
        )

    from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import (
        FullCudaGraphBackend,
    )

    replay = FullCudaGraphBackend.replay

    def counted_replay(self, shape_key, *args, **kwargs):
        variant = shape_key.attention_variant or ""
        if variant.startswith("request_slots:"):
            _bump("graph_replay_request_slots" + variant.split(":")[1])
        return replay(self, shape_key, *args, **kwargs)

    FullCudaGraphBackend.replay = counted_replay

    gate = Indexer._get_logits_head_gate

    def counted_gate(self, x, q_scale):
        if weights_proj_has_lora(self):
            _bump("dsa_lora_head_gate")
        return gate(self, x, q_scale)

    Indexer._get_logits_head_gate = counted_gate

    from sglang_graphfix.srt.layers.attention.dsa import dsa_indexer as gate_module

    for name, counter in (
        ("lora_head_gate", "dsa_lora_full_gate"),
        ("add_lora_head_gate_delta_", "dsa_lora_delta"),
        ("bf16_gemm_fp32_out", "dsa_lora_merged"),
    ):
        setattr(gate_module, name, _counted(getattr(gate_module, name), counter))


def _measure_prefill_graph_memory():
    import gc
    import json
    import logging

    import torch

    from sglang.srt.model_executor.model_runner_components import cuda_graph_setup

    capture = cuda_graph_setup.capture_prefill_graph

    def memory():
        torch.cuda.synchronize()
        return (
            torch.cuda.mem_get_info()[0],
            torch.cuda.memory_reserved(),
            torch.cuda.memory_allocated(),
        )

    def measured_capture(*args, **kwargs):
        gc.collect()  # what is already garbage is not "held before"
        held = _held_device_storages()
        free, reserved, allocated = memory()
        result = capture(*args, **kwargs)
        free_after, reserved_after, allocated_after = memory()
        new = _new_storages(held, _held_device_storages())
        backend = getattr(getattr(result, "runner", result), "backend", None)
        gib = 1 << 30
        taken, pool = (free - free_after) / gib, (reserved_after - reserved) / gib
        split = {
            "taken_gib": round(taken, 3),
            "allocator_reserved_gib": round(pool, 3),
            "allocator_allocated_gib": round((allocated_after - allocated) / gib, 3),
            "outside_allocator_gib": round(taken - pool, 3),
            "graphs": len(getattr(backend, "_graphs", None) or ()),
            "backend": type(backend).__name__ if backend is not None else None,
            "held_after_capture": _largest_groups(new),
        }
        logging.getLogger("graphfix_test_probe").warning(
            "graphfix probe: prefill graph memory %s", json.dumps(split)
        )
        return result

    cuda_graph_setup.capture_prefill_graph = measured_capture


HELD_DEVICE = "cuda"  # the device whose tensors _held_device_storages lists


def _held_device_storages():
    """{(storage pointer, bytes): (shape, dtype)} of the HELD_DEVICE tensors the
    garbage collector can reach, a base tensor standing for its storage where
    one is met (else the first view); None where the walk itself fails (the
    probe never stops the server it measures)."""
    import gc

    import torch

    try:
        held = {}
        for obj in gc.get_objects():
            # type(), not isinstance: a dead weakref proxy raises on __class__.
            if not issubclass(type(obj), torch.Tensor):
                continue
            try:
                if obj.device.type != HELD_DEVICE:
                    continue
                storage = obj.untyped_storage()
                key = (storage.data_ptr(), storage.nbytes())
                entry = (tuple(obj.shape), str(obj.dtype))
                base = obj._base is None
            except Exception:  # no plain storage (sparse, fake, meta tensors)
                continue
            if base or key not in held:
                held[key] = entry
        return held
    except Exception:
        return None


def _new_storages(before, after) -> list | None:
    """[(bytes, shape, dtype)] of the storages held after and not before (keyed
    by pointer and size: an address freed and reused for another size is new)."""
    if before is None or after is None:
        return None
    return [(key[1], *entry) for key, entry in after.items() if key not in before]


def _largest_groups(storages, top=8) -> list | None:
    """Storages grouped by (shape, dtype): count and MiB, the largest first."""
    if storages is None:
        return None
    groups = {}
    for nbytes, shape, dtype in storages:
        count, total = groups.get((shape, dtype), (0, 0))
        groups[(shape, dtype)] = (count + 1, total + nbytes)
    ranked = sorted(groups.items(), key=lambda item: -item[1][1])[:top]
    return [
        {
            "shape": list(shape),
            "dtype": dtype,
            "count": count,
            "mib": round(total / 2**20, 3),
        }
        for (shape, dtype), (count, total) in ranked
    ]


def _counted(fn, counter):
    def counted(*args, **kwargs):
        _bump(counter)
        return fn(*args, **kwargs)

    return counted


def _counted_fill(fill, family, wrong_state):
    def counted_fill(backend, forward_batch, *, in_capture):
        meta = fill(backend, forward_batch, in_capture=in_capture)
        _bump(f"{family}_graph_capture" if in_capture else f"{family}_graph_replay")
        if not in_capture:
            _bump(f"{family}_graph_replay_slots{forward_batch.batch_size}")
        if wrong_state and not in_capture:
            # Mamba2: Mamba2FullGraphMetadata, whose mamba_cache_indices are
            # its tables' cache_indices (one tensor, read by the whole extend);
            # short conv: its tables' (padding rows, PAD_SLOT_ID, stay skipped).
            indices = (meta.tables if family == "mamba2" else meta).cache_indices
            indices.masked_fill_(indices >= 0, 0)
        return meta

    return counted_fill


def _record_upstream():
    """Baseline runs (SGLANG_PLUGINS=graphfix_test_probe): record whether
    sglang-graphfix's hooks are absent from this process."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
        HybridLinearAttnBackend,
    )

    patched = hasattr(
        HybridLinearAttnBackend.init_forward_metadata_out_graph, "__wrapped__"
    )
    _bump("graphfix_present" if patched else "graphfix_absent")
