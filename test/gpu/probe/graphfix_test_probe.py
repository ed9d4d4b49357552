"""Test-only sglang plugin, found through the dist-info beside it (test/gpu puts
this folder on PYTHONPATH for the engine processes).

Counts, in files under GRAPHFIX_PROBE_DIR (one byte per event):
  gdn_graph_capture / gdn_graph_replay   GDN full prefill graph tables filled
                                         for a capture / before a replay
  dsa_lora_head_gate                     Indexer._get_logits_head_gate with a
                                         LoRA-owned weights_proj (only the graph
                                         split op calls it so)
GRAPHFIX_PROBE_FAULT=gdn_wrong_state points every real request of a GDN graph
replay at the padding state slot: the test uses it to show it can fail.
"""

import os


def _bump(name):
    with open(os.path.join(os.environ["GRAPHFIX_PROBE_DIR"], name), "ab") as f:
        f.write(b".")


def register():
    if not os.environ.get("GRAPHFIX_PROBE_DIR"):
        return
    import sglang_graphfix

    sglang_graphfix.register()  # wrap on top of the real patches

    from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer
    from sglang_graphfix.srt.layers.attention import (
        hybrid_linear_attn_backend as hybrid,
    )
    from sglang_graphfix.srt.layers.attention.dsa.dsa_indexer import (
        weights_proj_has_lora,
    )

    fill = hybrid.prepare_full_prefill_graph_tables
    wrong_state = os.environ.get("GRAPHFIX_PROBE_FAULT") == "gdn_wrong_state"

    def counted_fill(backend, forward_batch, *, in_capture):
        meta = fill(backend, forward_batch, in_capture=in_capture)
        _bump("gdn_graph_capture" if in_capture else "gdn_graph_replay")
        if wrong_state and not in_capture:
            meta.cache_indices.masked_fill_(meta.cache_indices >= 0, 0)
        return meta

    hybrid.prepare_full_prefill_graph_tables = counted_fill

    gate = Indexer._get_logits_head_gate

    def counted_gate(self, x, q_scale):
        if weights_proj_has_lora(self):
            _bump("dsa_lora_head_gate")
        return gate(self, x, q_scale)

    Indexer._get_logits_head_gate = counted_gate
