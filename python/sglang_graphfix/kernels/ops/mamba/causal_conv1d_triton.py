# SPDX-License-Identifier: Apache-2.0
"""sglang's Triton causal conv under a Mamba2 full prefill graph.

Fixes sglang/kernels/ops/mamba/causal_conv1d_triton.py (issue 16;
docs/mamba2_full_prefill_graph.md, "How it is wired", the conv): upstream's
MambaMixer2 launches the extend's conv with ``seq_lens_cpu`` only, which a full
graph's bucket sets to its bound, R + 1 sequences of up to T tokens. The kernel
also takes a ``block_table`` of (sequence, block) rows, launching one program per
row instead; a bucket's metadata carries one in its launch bound
(``ConvLaunchLengths``) when MAMBA2_CONV_BLOCK_TABLE is on.
"""

from __future__ import annotations

_SEQ_LENS_CPU = 5  # causal_conv1d_fn's positional index of seq_lens_cpu


# What:    Wraps causal_conv1d_triton.causal_conv1d_fn: a call whose
#          seq_lens_cpu carries a block table (a Mamba2 full-graph bucket's
#          ConvLaunchLengths) and passes none launches over that table.
# Why:     Upstream's grid is (sequences, cdiv(longest, BLOCK_M), channel
#          blocks); on a bucket's bound that is R + 1 sequences x the whole
#          bucket, almost every program past its sequence's end (Falcon-H1-7B,
#          8 x 64 tokens in 16 slots: 0.55 ms a forward against breakable's
#          0.07).
# How:     Pass block_table=seq_lens_cpu.block_table through to the original;
#          every other call (plain lists, an explicit block_table: sglang's and
#          our GDN/KDA graphs) is unchanged. HookRegistry carries the wrapper to
#          the modules that imported the function (mamba.py's
#          causal_conv1d_fn_triton, causal_conv1d.py's _causal_conv1d_fn_triton).
# Upstream: sglang/kernels/ops/mamba/causal_conv1d_triton.py::causal_conv1d_fn
#          (the change to propose is in sglang/srt/layers/attention/mamba/
#          mamba.py::MambaMixer2.forward: pass the metadata's block table, as the
#          KDA graph extend does)
# Removal: once upstream's MambaMixer2 passes a conv block table.
def launch_conv_on_bucket_block_table(original, *args, **kwargs):
    lengths = (
        kwargs.get("seq_lens_cpu")
        if "seq_lens_cpu" in kwargs
        else (args[_SEQ_LENS_CPU] if len(args) > _SEQ_LENS_CPU else None)
    )
    table = getattr(lengths, "block_table", None)
    if table is not None and kwargs.get("block_table") is None:
        kwargs["block_table"] = table
    return original(*args, **kwargs)
