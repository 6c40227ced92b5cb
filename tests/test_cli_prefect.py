"""status links, logs and cancel against a real Prefect server (no workers needed).

The server is the embedded default's own (started by h3flow's service code); a run's
flow runs are created through the API the way the dispatcher creates them: a batch run
named after the run, children tagged ``h3flow-run:<id>`` and named ``<clip> <stage> on <pool>``.
"""

from __future__ import annotations

import json
from pathlib import Path
from uuid import UUID

import pytest
from conftest import PrefectServer  # tests/ is on sys.path (rootdir conftest)
from test_cli import make_config, make_run, runner

from h3flow.cli import app
from h3flow.config.models import load_local_config
from h3flow.core.contracts import run_tag
from h3flow.pipeline.manifest import load_manifest, save_manifest
from h3flow.pipeline.prefect_api import api_client

pytestmark = pytest.mark.prefect

CLIPS = ["lake-sunrise-wide-0001", "lake-sunrise-wide-0002", "mountain-pass-at-dusk-with-fog-03"]


def make_flow_runs(prefect_server: PrefectServer, run_id: str) -> dict[str, str]:
    """The batch run (running, two log lines) and three children: running, scheduled, completed."""
    from prefect import flow, task
    from prefect.client.schemas.actions import LogCreate
    from prefect.states import Completed, Running, Scheduled

    batch_flow = flow(name="batch")(lambda: None)  # stand-ins: only their names reach the server
    child_flow = flow(name="sample-clip")(lambda: None)
    ids: dict[str, str] = {}
    with api_client(prefect_server.config) as client:
        batch = client.create_flow_run(batch_flow, name=run_id, state=Running())
        ids["batch"] = str(batch.id)
        children = [
            (CLIPS[0], "sample", "a0", Running()),
            (CLIPS[1], "sample", "a1", Scheduled()),
            (CLIPS[2], "decode", "b", Completed()),
        ]
        for clip, stage, pool, state in children:
            name = f"{run_id}/{clip} {stage} on {pool}" if clip == CLIPS[1] else f"{clip} {stage} on {pool}"
            run = client.create_flow_run(child_flow, name=name, tags=[run_tag(run_id)], state=state)
            ids[clip] = str(run.id)
        other = client.create_flow_run(child_flow, name=f"{CLIPS[0]} sample on a0", tags=[run_tag("another-run")])
        ids["other"] = str(other.id)
        encode = client.create_task_run(task(name="encode")(lambda: None), UUID(ids[CLIPS[0]]), "0", name="encode-0")
        lines = [
            (ids["batch"], None, f"{CLIPS[0]}: routed to a0 [pool 1/2]"),
            (ids["batch"], None, f"{CLIPS[2]}: failed: pattern '^[a-z]$'"),
            (ids[CLIPS[0]], None, "sampling 6 steps"),
            (ids[CLIPS[0]], encode.id, "Finished in state Completed()"),  # a task's line, as the UI shows it
            (ids["other"], None, "not this run's"),
        ]
        client.create_logs(
            [
                LogCreate(
                    name="prefect.task_runs" if task_run else "prefect.flow_runs",
                    level=20,
                    message=message,
                    timestamp=_ts(i),
                    flow_run_id=UUID(fid),
                    task_run_id=task_run,
                )
                for i, (fid, task_run, message) in enumerate(lines)
            ]
        )
    manifest = load_manifest(prefect_server.config.runs_dir, run_id)  # the dispatcher records its own flow run
    manifest.flow_run_ids = [ids["batch"]]
    save_manifest(prefect_server.config.runs_dir, manifest)
    return ids


def _ts(i: int):
    from datetime import UTC, datetime, timedelta

    return datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC) + timedelta(seconds=i)


def test_status_shows_each_clips_ui_link(prefect_server: PrefectServer) -> None:
    run_id = make_run(prefect_server.config_path, "links-20250101-000000-0001", CLIPS)
    ids = make_flow_runs(prefect_server, run_id)
    ui = prefect_server.config.prefect.api_url.removesuffix("/api")
    res = runner.invoke(app, ["status", run_id, "-c", str(prefect_server.config_path), "--json"])
    assert res.exit_code == 0, res.output
    prefect = json.loads(res.output)["prefect"]
    assert [r["link"] for r in prefect["batch"]] == [f"{ui}/runs/flow-run/{ids['batch']}"]
    for clip in CLIPS:
        assert [r["link"] for r in prefect[clip]] == [f"{ui}/runs/flow-run/{ids[clip]}"]
    assert prefect[CLIPS[1]][0]["stage"] == "sample" and prefect[CLIPS[2]][0]["state"] == "COMPLETED"
    res = runner.invoke(app, ["status", run_id, "-c", str(prefect_server.config_path)])
    assert res.exit_code == 0
    for clip in CLIPS:
        assert f"{ui}/runs/flow-run/{ids[clip]}\n" in res.output  # one line each, whole
    assert ids["other"] not in res.output


def test_logs_of_the_batch_run_and_of_one_clip(prefect_server: PrefectServer) -> None:
    run_id = make_run(prefect_server.config_path, "logs-20250101-000000-0001", CLIPS)
    make_flow_runs(prefect_server, run_id)
    res = runner.invoke(app, ["logs", run_id, "-c", str(prefect_server.config_path)])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [
        f"12:00:00.000 INFO    {run_id}: {CLIPS[0]}: routed to a0 [pool 1/2]",
        f"12:00:01.000 INFO    {run_id}: {CLIPS[2]}: failed: pattern '^[a-z]$'",
    ]
    res = runner.invoke(app, ["logs", run_id, CLIPS[0], "-c", str(prefect_server.config_path), "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)["logs"]
    assert [(line["flow_run"], line["task_run"], line["message"]) for line in got] == [
        (f"{CLIPS[0]} sample on a0", None, "sampling 6 steps"),
        (f"{CLIPS[0]} sample on a0", "encode-0", "Finished in state Completed()"),
    ]
    res = runner.invoke(app, ["logs", run_id, CLIPS[0], "-c", str(prefect_server.config_path)])
    assert res.output.splitlines() == [  # the task's name, as the UI's log view shows it
        f"12:00:02.000 INFO    {CLIPS[0]} sample on a0: sampling 6 steps",
        f"12:00:03.000 INFO    {CLIPS[0]} sample on a0 › encode-0: Finished in state Completed()",
    ]
    res = runner.invoke(app, ["logs", run_id, "no-such-clip", "-c", str(prefect_server.config_path)])
    assert res.exit_code == 2 and "has no clip 'no-such-clip'" in res.output


def test_cancel_cancels_the_batch_and_the_children_that_have_not_ended(prefect_server: PrefectServer) -> None:
    from prefect.client.schemas.objects import StateType

    run_id = make_run(prefect_server.config_path, "cancel-20250101-000000-0001", CLIPS)
    ids = make_flow_runs(prefect_server, run_id)
    res = runner.invoke(app, ["cancel", run_id, "-c", str(prefect_server.config_path), "--json"])
    assert res.exit_code == 0, res.output
    cancelled = {r["id"]: r["state"] for r in json.loads(res.output)["cancelled"]}
    assert cancelled == {
        ids["batch"]: "CANCELLING",  # running: its worker stops it
        ids[CLIPS[0]]: "CANCELLING",
        ids[CLIPS[1]]: "CANCELLED",  # only scheduled: the server cancels it at once
    }
    with api_client(prefect_server.config) as client:
        states = {k: client.read_flow_run(UUID(v)).state_type for k, v in ids.items()}
    assert states[CLIPS[2]] == StateType.COMPLETED and states["other"] == StateType.PENDING  # left alone
    res = runner.invoke(app, ["cancel", run_id, "-c", str(prefect_server.config_path)])
    assert res.exit_code == 0 and "nothing to cancel" in res.output


def test_an_unreachable_server_is_one_line(tmp_path: Path) -> None:
    path = make_config(tmp_path / "wd")
    run_id = make_run(path)
    res = runner.invoke(app, ["logs", run_id, "-c", str(path)])
    assert res.exit_code == 2
    assert res.output.startswith(f"error: Prefect server at {load_local_config(path).prefect.api_url}: ")
    assert res.output.count("\n") == 1
