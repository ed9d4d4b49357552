"""benchmark/provenance.py (what every benchmark script records about its run) and
benchmark/render_results.py (RESULTS.md from the committed JSON): recorded
provenance is shown as recorded, a note typed in by hand never is, and the
committed RESULTS.md is what the renderer makes of the committed JSON."""

import re
import subprocess
from pathlib import Path

import pytest
from benchmark_modules import load_benchmark

ROOT = Path(__file__).resolve().parents[3]


provenance = load_benchmark("provenance")
render_results = load_benchmark("render_results")


def test_provenance_records_this_checkout(monkeypatch):
    monkeypatch.delenv("GRAPHFIX_COMMIT", raising=False)
    rec = provenance.provenance()
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    assert rec["commit"] == head.stdout.strip()
    assert rec["commit_source"] == "git"
    assert isinstance(rec["dirty"], bool)
    assert rec["versions"]["sglang"] == "0.5.23"
    assert rec["device"] is None  # CPU tests
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", rec["date_utc"])
    assert rec["command"].startswith("python3 ")


def test_the_shippers_commit_wins_over_a_git_folder(monkeypatch):
    """A shipped tree may carry a stale .git (the GPU machine's did): the
    shipper's commit is recorded, and what the .git says beside it."""
    monkeypatch.setenv("GRAPHFIX_COMMIT", "0123abc")
    monkeypatch.setattr(provenance, "_git", lambda *a: "fedcba9")
    sha, dirty, source = provenance._commit()
    assert (sha, dirty) == ("0123abc", False)
    assert source == "GRAPHFIX_COMMIT (the .git here says fedcba9)"


def test_commit_without_git_comes_from_the_shipper_or_is_unknown(monkeypatch, tmp_path):
    monkeypatch.setattr(provenance, "ROOT", tmp_path)  # no .git here
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    monkeypatch.setenv("GRAPHFIX_COMMIT", "0123abc-dirty")
    assert provenance._commit() == ("0123abc", True, "GRAPHFIX_COMMIT")
    monkeypatch.setenv("GRAPHFIX_COMMIT", "0123abc")
    assert provenance._commit() == ("0123abc", False, "GRAPHFIX_COMMIT")
    monkeypatch.delenv("GRAPHFIX_COMMIT")
    commit, dirty, source = provenance._commit()
    assert (commit, dirty) == (None, None)
    assert source.startswith("unknown")


def test_recorded_provenance_is_shown_as_recorded():
    rec = {
        "commit": "0123456789abcdef",
        "dirty": True,
        "commit_source": "git",
        "versions": {"sglang": "0.5.23", "flashinfer-python": None},
        "device": "NVIDIA H200",
        "date_utc": "2026-12-01T00:00:00+00:00",
        "command": "python3 benchmark/x.py --quick",
    }
    line = render_results.provenance_line({"provenance": rec})
    assert line.startswith("Recorded by the script: commit 0123456789 (uncommitted")
    assert "sglang 0.5.23" in line and "flashinfer" not in line
    assert "NVIDIA H200" in line and "`python3 benchmark/x.py --quick`" in line
    assert render_results._device({"provenance": rec}) == "NVIDIA H200"


def test_a_hand_written_note_is_never_shown_as_recorded():
    note = {"note": "typed by hand", "text": "ran at commit 028a40b"}
    line = render_results.provenance_line({"provenance_note_hand_written": note})
    assert "Recorded" not in line
    assert "typed in by hand, unverified: ran at commit 028a40b" in line
    assert "not recorded" in render_results.provenance_line({})


def test_committed_results_md_is_rendered_from_the_committed_json():
    content = render_results.TARGET.read_text()
    rendered = content.split(render_results.BEGIN)[1].split(render_results.END)[0]
    assert rendered.strip() == render_results.render().strip(), (
        "benchmark/RESULTS.md is stale: python3 benchmark/render_results.py --write"
    )


def test_readme_speedup_tables_are_rendered_from_the_committed_json():
    content = render_results.README.read_text()
    for name in render_results.README_TABLES:
        assert render_results.readme_rendered(content, name) == (
            render_results.readme_table(name)
        ), (
            f"README.md's {name} table is stale: python3 benchmark/render_results.py --write"
        )


def test_a_hand_edited_readme_figure_is_caught(tmp_path, monkeypatch):
    content = render_results.README.read_text()
    edited = content.replace("| 3.24x |", "| 3.30x |", 1)
    assert edited != content
    assert render_results.readme_rendered(
        edited, "nemotron-h-served"
    ) != render_results.readme_table("nemotron-h-served")
    # --write puts the rendered rows back, at the markers' indent.
    readme = tmp_path / "README.md"
    readme.write_text(edited)
    monkeypatch.setattr(render_results, "README", readme)
    render_results.write_readme()
    assert readme.read_text() == content


def test_a_rounded_speedup_never_crosses_a_goal():
    assert render_results.speedup(95.4 / 63.8) == "1.495x"  # not 1.50x
    assert render_results.speedup(1.978) == "1.98x"
    assert render_results.speedup(1.996) == "1.996x"  # not 2.00x
    assert render_results.speedup(0.9155) == "**0.92x**"
    assert render_results.speedup(0.9961) == "**0.996x**"  # slower, not 1.00x
