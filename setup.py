from setuptools import find_packages, setup

setup(
    name="sglang-graphfix",
    version="0.1.0",
    description=(
        "Fixes for two CUDA-graph failures in sglang 0.5.23: hybrid linear "
        "attention under a full prefill graph, and DSA indexer weights_proj LoRA "
        "under breakable/piecewise prefill graphs."
    ),
    license="Apache-2.0",
    # sgl-kernel/: Triton kernels sglang 0.5.23 lacks (sglang_graphfix_kernel).
    package_dir={
        "": "python",
        "sglang_graphfix_kernel": "sgl-kernel/python/sglang_graphfix_kernel",
    },
    packages=find_packages("python") + ["sglang_graphfix_kernel"],
    # Sample model configs for `sglang-graphfix explain` without --model-path.
    package_data={"sglang_graphfix": ["sample_configs/*/config.json"]},
    python_requires=">=3.10",
    install_requires=["sglang==0.5.23"],
    entry_points={
        "sglang.srt.plugins": ["graphfix = sglang_graphfix:register"],
        "console_scripts": ["sglang-graphfix = sglang_graphfix.cli:main"],
    },
)
