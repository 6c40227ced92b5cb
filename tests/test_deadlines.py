"""Every stage has a deadline from the profile; a stage past it is stopped, failed as ``timeout``
and sent again, and ``status`` names a clip in flight for longer than expected."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import Cluster, make_cluster, write_batch

from h3flow.config.adapt import adapt
from h3flow.config.models import LocalConfig, load_host_map, load_local_config
from h3flow.core.batch import Clip
from h3flow.pipeline.deadlines import EXPECTED_FLOOR_S, deadlines, slow_clips
from h3flow.pipeline.manifest import load_manifest, new_manifest
from h3flow.pipeline.results import FailureKind, classify

ROOT = Path(__file__).resolve().parents[1]
IMAGE = ROOT / "examples" / "images" / "landscape.png"


@pytest.fixture(scope="module")
def production() -> LocalConfig:
    return adapt(load_host_map(ROOT / "examples" / "host-map.example.json"), "four_four_plus_one")


def test_a_stage_may_take_its_profiled_time_times_the_margin_never_less_than_the_floor(
    production: LocalConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    sd = Clip(id="c", prompt="pan left", image=IMAGE, spec="sd", seed=1)
    limits = deadlines(production, sd, "a0", "b")
    # the shipped profile: a 4 x T10 pool samples a 5 s SD clip in 76.61 s (fitted to the design's table)
    assert 76 < limits.expected["sample"] < 80 and limits.of("sample") == pytest.approx(
        4 * limits.expected["sample"], abs=0.1
    )
    assert limits.of("transfer") == 120.0, "a sub-second transfer gets the floor"
    monkeypatch.setenv("H3FLOW_DEADLINE_MARGIN", "2")
    monkeypatch.setenv("H3FLOW_DEADLINE_FLOOR_S", "10")
    again = deadlines(production, sd, "a0", "b")
    assert again.of("sample") == pytest.approx(2 * limits.expected["sample"], abs=0.1) and again.of("transfer") == 10.0


def test_an_overrun_is_its_own_kind_which_the_dispatcher_sends_again() -> None:
    from prefect.task_engine import TaskRunTimeoutError

    assert classify(TaskRunTimeoutError("Scope timed out after 120 second(s).")) is FailureKind.TIMEOUT
    assert FailureKind.TIMEOUT.dispatcher_retries
    assert classify(TimeoutError("read timed out")) is FailureKind.TRANSIENT, "a socket's timeout stays transient"


def test_status_names_a_clip_in_flight_longer_than_expected(production: LocalConfig) -> None:
    clips = [Clip(id=f"c{i}", prompt="pan left", image=IMAGE, spec="sd", seed=i) for i in range(3)]
    manifest = new_manifest("r", "b", clips, "local.json")
    manifest.state = "running"
    now = 10_000.0
    for cid, state, since in (
        ("c0", "sampling", now - 600),
        ("c1", "sampling", now - 20),
        ("c2", "decoding", now - 300),
    ):
        rec = manifest.clips[cid]
        rec.state, rec.pool, rec.decoder = state, "a0", "b"  # type: ignore[assignment]
        rec.timeline["sample_submitted" if state == "sampling" else "decode_submitted"] = since
    slow = {s.clip: s for s in slow_clips(manifest, production, now)}
    assert set(slow) == {"c0", "c2"}, "c1 is within what its stages should take"
    assert slow["c0"].line().startswith("c0: sampling on a0 for 10 min 00 s, longer than expected (")
    assert slow["c2"].pool == "b" and slow["c2"].expected >= EXPECTED_FLOOR_S
    manifest.state = "completed"
    assert slow_clips(manifest, production, now) == [], "a run that is over has nothing in flight"


STRICT = {"H3FLOW_DEADLINE_FLOOR_S": "3", "H3FLOW_DEADLINE_MARGIN": "1.01"}
"""The strict cluster's deadline settings, which the test also computes its clip's deadline with."""


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster whose workers give every stage its expected time (the reference model's CPU profile) x 1.01,
    at least 3 s: a 10 s HD clip's 100-step sample (29 s on a 2-core machine against 9.6 s expected) overruns.
    (A 2 s 24-step clip, 3.3 s here against a 3 s floor, once finished in time on a faster CI machine.)"""
    saved = {k: os.environ.get(k) for k in STRICT}
    os.environ.update(STRICT)
    try:
        c = make_cluster(tmp_path_factory.mktemp("deadlines"))
        c.start()  # the workers take these settings with them
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield c
    c.stop()


@pytest.mark.prefect
def test_a_stage_past_its_deadline_is_stopped_failed_as_timeout_and_sent_again(
    strict: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = write_batch(
        tmp_path / "overrun.json",
        [{"id": "long", "seed": 1, "spec": "hd", "seconds": 10, "steps": 100}, {"id": "short", "seed": 2}],
    )
    run_id = strict.submit(batch)
    t0 = time.monotonic()
    done = strict.h3("wait", run_id)
    assert done.returncode == 1, done.stdout + done.stderr
    manifest = load_manifest(load_local_config(strict.config_path).runs_dir, run_id)
    assert manifest.clips["short"].state == "delivered"
    long = manifest.clips["long"]
    assert long.state == "failed" and long.failure is FailureKind.BUDGET and long.attempts == 4, long
    for key, value in STRICT.items():
        monkeypatch.setenv(key, value)
    limit = deadlines(strict.config, long.clip, long.pool or "", "b").of("sample")
    assert 3 <= limit < 20 and f"timeout: Scope timed out after {limit:g} second" in (long.error or ""), long.error
    assert strict.invocations("sample", "long") == 4, "each try really started, and was stopped"
    assert time.monotonic() - t0 < 180, "four overruns of a short deadline, not four full samples"
