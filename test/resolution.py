"""sglang's own server-argument resolution on a model directory, as on a
simulated GPU: the shared step of the CPU tests of the prefill-graph plan."""

from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
from sglang.srt.server_args import ServerArgs
from sglang_graphfix.cli import simulated_gpu


def resolved(model_path, *, gpu="h200", model_default_full=False, **kwargs):
    """ServerArgs after sglang's full resolution pipeline. ``model_default_full``
    declares the full prefill graph as a model default, the way Inkling's
    apply_inkling_prefill_cuda_graph_default does (locked, but not the user's)."""
    args = ServerArgs(model_path=model_path, **kwargs)
    if model_default_full:
        declare_resolution(
            args, "test_model_default", cuda_graph_backend_prefill="full"
        )
    with simulated_gpu(gpu):
        args.resolve_once()
    return args


def prefill_backend(args):
    return resolving_view(args).cuda_graph_config.prefill.backend
