"""The GPU tests' verdicts (test/gpu/engine_utils.py), on hand-made outputs: what
counts as graph == eager, and what a can-fail control must show."""

import os
import sys

import pytest

# engine_utils puts the test probe plugin on sys.path and names its counter
# folder in the environment, for the engine processes; undo both here, so that
# no CPU test's sglang loads that plugin.
_path, _probe_dir = list(sys.path), os.environ.get("GRAPHFIX_PROBE_DIR")
from gpu.engine_utils import (  # noqa: E402  (test/gpu/engine_utils.py)
    assert_graph_matches_eager,
    compare,
    diverged,
    graph_vs_eager,
)

sys.path[:] = _path
if _probe_dir is None:
    os.environ.pop("GRAPHFIX_PROBE_DIR", None)

TOL = 0.05


def _out(ids, logprobs, top2=None, first=None):
    return {
        "output_ids": ids,
        "output_logprobs": logprobs,
        "top2": top2 or [[lp, lp - 1.0] for lp in logprobs],
        "first_topk": first or {ids[0]: logprobs[0], 99: logprobs[0] - 1.0},
    }


def test_identical_outputs_match():
    a = _out([1, 2, 3], [-0.5, -0.6, -0.7])
    report = graph_vs_eager([[a]], [[dict(a)]], tol=TOL)
    assert_graph_matches_eager(report)
    assert not diverged(report["batches"][0])


def test_logprob_drift_beyond_tolerance_is_a_mismatch():
    a = _out([1, 2, 3], [-0.5, -0.6, -0.7])
    b = _out([1, 2, 3], [-0.5, -0.7, -0.7])
    report = compare([a], [b], tol=TOL)
    assert report["mismatches"] == [
        {"prompt": 0, "step": 1, "logprob_diff": pytest.approx(0.1)}
    ]


def test_near_tie_split_passes_the_match_but_counts_as_divergence():
    tie = [[-0.69, -0.70]] * 3
    a = _out([1, 2, 3], [-0.69] * 3, top2=tie)
    b = _out([1, 5, 6], [-0.69] * 3, top2=tie)
    report = compare([a], [b], tol=TOL)
    assert not report["mismatches"] and report["near_tie_splits"] == 1
    assert report["near_tie_gaps"] == [pytest.approx(0.01)]
    assert diverged(report)


def test_shorter_output_is_a_mismatch():
    a = _out([1, 2, 3], [-0.5, -0.6, -0.7])
    b = _out([1, 2], [-0.5, -0.6])
    assert compare([a], [b], tol=TOL)["mismatches"] == [
        {"prompt": 0, "lengths": [3, 2]}
    ]


def test_different_prefill_logits_fail_the_first_token_check():
    a = _out([1, 2], [-0.5, -0.6], first={1: -0.5, 7: -1.0})
    b = _out([1, 2], [-0.5, -0.6], first={1: -0.5, 7: -1.2})
    with pytest.raises(AssertionError):
        assert_graph_matches_eager(graph_vs_eager([[a]], [[b]], tol=TOL))
