"""The run manifest on disk: a snapshot plus a journal of changes, read back whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from h3flow.core.batch import Clip
from h3flow.pipeline.manifest import ManifestWriter, journal_path, load_manifest, manifest_path, new_manifest
from h3flow.pipeline.results import StageResult

IMAGE = Path(__file__).resolve().parents[1] / "examples" / "images" / "landscape.png"


def manifest(n: int):
    clips = [Clip(id=f"c{i}", prompt="p", image=IMAGE, seed=i) for i in range(n)]
    return new_manifest("run-1", "b", clips, "local.json")


def test_the_journal_replays_onto_the_snapshot(tmp_path: Path) -> None:
    m = manifest(5)
    writer = ManifestWriter(tmp_path, "run-1")
    writer.save(m, set())  # the first save is a snapshot
    m.state = "running"
    m.clips["c1"].state, m.clips["c1"].pool = "sampling", "a0"
    writer.save(m, {"c1"})
    m.clips["c1"].state = "sampled"
    m.clips["c3"].state, m.clips["c3"].error = "failed", "input: no such image"
    writer.save(m, {"c1", "c3"})
    back = load_manifest(tmp_path, "run-1")
    assert back == m.model_copy(update={"updated": back.updated})
    assert len(journal_path(tmp_path, "run-1").read_text().splitlines()) == 2


def test_a_save_costs_the_changes_not_the_run(tmp_path: Path) -> None:
    sizes = []
    for n in (10, 2000):
        m = manifest(n)
        writer = ManifestWriter(tmp_path / str(n), "run-1")
        writer.save(m, set())
        journal = journal_path(tmp_path / str(n), "run-1")
        m.clips["c0"].state = "sampling"
        writer.save(m, {"c0"})
        sizes.append(journal.stat().st_size)
    assert sizes[1] == sizes[0], "one changed clip appends the same bytes whatever the batch size"
    assert manifest_path(tmp_path / "2000", "run-1").stat().st_size > 100 * sizes[1]


def test_a_line_cut_short_by_a_crash_is_ignored_and_snapshots_rotate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ManifestWriter, "SNAPSHOT_EVERY", 3)
    m = manifest(3)
    writer = ManifestWriter(tmp_path, "run-1")
    writer.save(m, set())
    for state in ("sampling", "sampled", "decoding"):
        m.clips["c0"].state = state
        writer.save(m, {"c0"})
    assert journal_path(tmp_path, "run-1").read_text().count("\n") == 3
    m.clips["c0"].state = "delivered"
    writer.save(m, {"c0"})  # the fourth save folds everything into a new snapshot
    assert journal_path(tmp_path, "run-1").read_text() == ""
    assert load_manifest(tmp_path, "run-1").clips["c0"].state == "delivered"
    m.clips["c2"].state = "sampling"
    writer.save(m, {"c2"})
    with open(journal_path(tmp_path, "run-1"), "a") as handle:
        handle.write('{"header": {"journal_seq": 99, "state": "fail')  # the dispatcher died mid-line
    back = load_manifest(tmp_path, "run-1")
    assert back.clips["c2"].state == "sampling" and back.state == "pending"


def test_the_executed_charts_title_says_the_span_its_legend_shows(tmp_path: Path) -> None:
    """Both read the same figure (before: the title had the run's wall time, 40.93 s, the legend 40.6 s)."""
    from h3flow.config.adapt import adapt, local_host_map
    from h3flow.pipeline.run_report import executed_schedule, gantt_title

    config = adapt(local_host_map(tmp_path, base_port=41000), work_dir=str(tmp_path))
    clip = Clip(id="c0", prompt="pan left", image=IMAGE, spec="tiny", seed=1)
    m = new_manifest("r", "b", [clip], "local.json")
    m.started, m.finished = 100.0, 141.0  # the report and chart are written after the last stage
    rec = m.clips["c0"]
    rec.pool, rec.decoder = "a0", "b"
    rec.stages = {
        "encode": StageResult(stage="encode", started=101.0, seconds=1.0),
        "sample": StageResult(stage="sample", started=102.0, seconds=10.0),
        "transfer": StageResult(stage="transfer", started=112.0, seconds=0.5),
        "decode": StageResult(stage="decode", started=113.0, seconds=27.6),
    }
    schedule = executed_schedule(m, config)
    assert schedule.makespan == pytest.approx(40.6)
    assert gantt_title(m, config, schedule).endswith(": 40.6 s to its last stage")
