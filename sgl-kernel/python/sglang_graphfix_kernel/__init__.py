# SPDX-License-Identifier: Apache-2.0
"""Triton kernels sglang-graphfix needs that sglang 0.5.23 does not have.

Each kernel takes sglang's own data structures (e.g. its LoRA batch info) and is
tested against sglang's kernels or a float32 reference."""
