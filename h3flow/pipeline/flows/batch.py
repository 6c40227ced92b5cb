"""The ``batch`` flow: plan, dispatch, collect, report — and the scheduled inbox.

``h3flow run`` calls it with a staged batch (validated, images hashed and staged, the
batch itself staged on the dispatcher's host and passed by its SHA-256); from the UI or
``prefect deployment run batch/run --param batch=/abs/path.json`` it reads a batch file
on the dispatcher's host. An existing ``run_id`` with ``resume``
(what ``h3flow resume`` found on the hosts) continues that run. Called with nothing
(the cron deployment) it takes every ``*.json`` in the inbox folder and runs each,
moving the file to ``done/`` or ``failed/`` with its run id.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.states import Cancelled, Crashed, State

from h3flow.config.models import LocalConfig, config_at
from h3flow.core.batch import Batch, load_batch, with_image_hashes
from h3flow.core.contracts import DISPATCHER_TAG, H3FLOW_TAG, run_tag
from h3flow.core.errors import ConfigError, H3FlowError
from h3flow.core.fsutil import atomic_write_text, file_lock
from h3flow.pipeline import stopping
from h3flow.pipeline.artifacts import Progress, publish_plan, publish_report
from h3flow.pipeline.dispatcher import Dispatcher, Superseded, planner_chooser
from h3flow.pipeline.flows.clip import config_path_or_env
from h3flow.pipeline.lifecycle import move
from h3flow.pipeline.manifest import (
    Manifest,
    ManifestWriter,
    load_manifest,
    manifest_path,
    new_manifest,
    new_run_id,
    run_dir,
    save_manifest,
)
from h3flow.pipeline.params import ResumePlan, StagedBatch
from h3flow.pipeline.plan import PLAN_TIME_LIMIT, QUICK_PLAN_CLIPS, clips_of, plan_clips, plan_for_manifest
from h3flow.pipeline.prefect_api import UNAVAILABLE, PrefectApi
from h3flow.pipeline.run_report import write_run_report


def open_run(
    config_path: str,
    run_id: str | None,
    batch_file: str | None = None,
    staged: StagedBatch | None = None,
    resume: ResumePlan | None = None,
) -> Manifest:
    """The run's manifest: loaded (and brought up to date with ``resume``) when the run exists,
    created from the staged batch or the batch file otherwise. The dispatcher is its only writer."""
    config = config_at(config_path)
    if run_id and manifest_path(config.runs_dir, run_id).exists():
        manifest = load_manifest(config.runs_dir, run_id)
        if resume:
            apply_resume(manifest, resume)
        return manifest
    if resume:
        raise ConfigError(f"nothing to resume: no manifest for run {run_id} in {config.runs_dir}")
    if staged is not None:
        parsed = read_staged(config, staged)
    elif batch_file is not None:
        path = Path(batch_file)
        if not path.is_absolute():
            raise ConfigError(
                f"batch={batch_file!r}: give the batch file's absolute path on the dispatcher's host "
                f"({config.control_host}); a relative one would be read from the worker's folder {Path.cwd()}"
            )
        parsed = with_image_hashes(load_batch(path))
    else:
        raise ConfigError("a new run needs a batch: batch=<absolute path of a batch file>, or `h3flow run`")
    manifest = new_manifest(run_id or new_run_id(parsed.name), parsed.name, parsed.clips, config_path)
    save_manifest(config.runs_dir, manifest)
    return manifest


def read_staged(config: LocalConfig, staged: StagedBatch) -> Batch:
    """The batch ``h3flow run`` staged on this host, checked against its SHA-256."""
    from h3flow.core.files import file_intact

    path = StagedBatch.path(config, staged.sha256)
    if not file_intact(path, staged.sha256):
        raise ConfigError(f"staged batch {staged.name} ({staged.sha256[:12]}) is missing or damaged at {path}")
    batch = Batch.model_validate_json(path.read_bytes())
    if len(batch.clips) != staged.clips:
        raise ConfigError(f"staged batch {staged.name}: {len(batch.clips)} clips, the run was told {staged.clips}")
    return batch


def apply_resume(manifest: Manifest, resume: ResumePlan) -> None:
    """Continue each clip from what ``resume`` verified on the hosts; unfinished clips get a fresh budget."""
    resend = set(resume.resend)
    for cid, state in resume.states.items():
        rec = manifest.clips[cid]
        move(rec, state, cid)
        rec.retransfer = cid in resend
        if state != "delivered":
            rec.error, rec.failure, rec.attempts, rec.decode_attempts, rec.submissions = None, None, 0, 0, {}
            if state == "pending":
                rec.output = rec.output_sha256 = None
    manifest.state, manifest.error, manifest.finished = "pending", None, None


@flow(name="batch", log_prints=True)
def batch(
    batch: str | None = None,
    run_id: str | None = None,
    config_path: str | None = None,
    staged: StagedBatch | None = None,
    resume: ResumePlan | None = None,
) -> dict[str, Any] | State[Any]:
    """Dispatch a batch over the pools (or, given nothing, process the inbox).

    Args:
        batch: a batch file (JSON) on the dispatcher's host, as an absolute path
        run_id: the run's id (default: made from the batch's name); an existing run continues
        config_path: local.json on the dispatcher's host (default: $H3FLOW_CONFIG)
        staged: the batch `h3flow run` validated and staged on the dispatcher's host, by SHA-256
        resume: what `h3flow resume` verified on the hosts, per clip
    """
    path = config_path_or_env(config_path)
    if batch is None and staged is None and run_id is None:
        return process_inbox(path)
    config = config_at(path)
    try:
        if run_id and manifest_path(config.runs_dir, run_id).exists():  # resumed: loaded as its only dispatcher
            with sole_dispatcher(config.runs_dir, run_id):
                return run_batch(open_run(path, run_id, resume=resume), path)
        manifest = open_run(path, run_id, batch, staged, resume)
        with sole_dispatcher(config.runs_dir, manifest.run_id):
            return run_batch(manifest, path)
    except Superseded as exc:  # Prefect had this run over already: keep its record as it was (crashed)
        return Crashed(message=f"superseded: {exc}")
    except H3FlowError as exc:  # the whole story in the log and in the run's state, not just its first line
        get_run_logger().error(told_whole(exc))
        raise ConfigError(told_whole(exc, sep=" ")) from None


def told_whole(exc: H3FlowError, sep: str = "\n  ") -> str:
    """An error with its details ("5 problems:" then each; the list was capped where it was made)."""
    return sep.join([str(exc), *exc.details])


@contextlib.contextmanager
def sole_dispatcher(runs_dir: str, run_id: str) -> Iterator[None]:
    """One dispatcher writes a run's manifest at a time: an exclusive lock beside it, held for the
    dispatcher's life (the kernel drops it if the process dies). ``resume`` starts a new dispatcher
    only once Prefect says the old one is over; one that stalled and has not noticed yet keeps the
    lock until it sees its run is over and stops, so its last writes come before the new one reads."""

    def waiting() -> None:
        get_run_logger().warning("run %s: an earlier dispatcher still holds it; waiting for it to stop", run_id)

    with file_lock(run_dir(runs_dir, run_id) / "dispatcher.lock", waiting):
        yield


def run_batch(manifest: Manifest, config_path: str, name_the_run: bool = True) -> dict[str, Any] | State[Any]:
    from prefect.runtime import flow_run

    logger = get_run_logger()
    config = config_at(config_path)
    own_id = str(flow_run.id) if flow_run.id else None
    if own_id and own_id not in manifest.flow_run_ids:
        manifest.flow_run_ids.append(own_id)
    if manifest.submitted is None and own_id:  # where the run's start-up begins (first_start in calibration)
        manifest.submitted = flow_run.scheduled_start_time.timestamp()
    api = PrefectApi(parent_flow_run_id=own_id)
    try:
        if own_id:  # the inbox run keeps its name and gathers one tag per batch it runs
            api.name_run(
                own_id,
                manifest.run_id if name_the_run else None,
                [run_tag(manifest.run_id), H3FLOW_TAG, DISPATCHER_TAG],
            )
        logger.info("run %s: %d clips on %s", manifest.run_id, len(manifest.clips), config.topology)
        progress = Progress(manifest)

        writer = ManifestWriter(config.runs_dir, manifest.run_id)

        def save(m: Manifest, changed: set[str]) -> None:
            writer.save(m, changed)
            try:
                progress.update(m)
            except UNAVAILABLE as exc:  # the UI's bar can wait; the record cannot
                logger.warning("progress artifact not updated: %s", exc)

        quick = plan_for_manifest(manifest, config, time_limit=0.0)  # the heuristics: at once
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="h3flow-plan") as search:
            better = (
                search.submit(plan_clips, clips_of(manifest), config, PLAN_TIME_LIMIT)
                if quick is not None and len(manifest.clips) <= QUICK_PLAN_CLIPS
                else None
            )
            dispatcher = Dispatcher(
                config,
                config_path,
                manifest,
                api,
                save,
                choose=planner_chooser(config, quick.schedule if quick else None),
                incarnation=(own_id or "local")[:8],
                own_flow_run_id=own_id,
                log=logger.info,
                stop_requested=lambda: stopping.stop_reason(own_id),
                plan=quick,
                better_plan=better,
            )
            result = dispatcher.run()
        plan = dispatcher.plan
    finally:
        manifest.dispatch_api_calls += api.calls
        api.close()
    paths = write_run_report(result, config)
    try:
        if plan is not None:  # drawn after the run: a large batch's chart never delays the first clip
            publish_plan(result, plan.schedule, config, plan.proven)
        publish_report(result, paths)
    except UNAVAILABLE as exc:  # the report files are written; the run's end must still be recorded
        logger.warning("plan/report artifacts not published (Prefect API unavailable: %s)", exc)
    logger.info(
        "run %s %s: %d/%d delivered; report %s",
        result.run_id,
        result.state,
        len(result.delivered),
        len(result.clips),
        paths["md"],
    )
    save_manifest(config.runs_dir, result)  # the final state, last: `wait` returns on it
    if result.state == "cancelled":
        return Cancelled(message=f"run {result.run_id} cancelled: `h3flow resume {result.run_id}` continues it")
    if result.state == "failed":
        raise RuntimeError(f"run {result.run_id} failed: {result.error or ', '.join(c.clip.id for c in result.failed)}")
    return {"run_id": result.run_id, "state": result.state, "delivered": len(result.delivered)}


def process_inbox(config_path: str) -> dict[str, Any]:
    """Run every batch file in the inbox; a bad or failing one is moved to ``failed/`` with its reason.

    The inbox run ends Failed when any file failed (its log and ``<file>.reason.txt`` say why),
    after the other files have run.
    """
    logger = get_run_logger()
    config = config_at(config_path)
    if config.prefect.schedule is None:
        raise ValueError("no inbox: local.json has no prefect.schedule")
    inbox = Path(config.prefect.schedule.inbox)
    done: dict[str, str] = {}
    failures: list[str] = []
    for file in sorted(inbox.glob("*.json")):
        claimed = inbox / "processing" / file.name
        claimed.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(file, claimed)  # one dispatcher per file, even with overlapping schedules
        except FileNotFoundError:
            continue
        run_id = new_run_id(file.stem)
        reason = None
        try:
            run_batch(open_run(config_path, run_id, batch_file=str(claimed)), config_path, name_the_run=False)
        except Exception as exc:  # noqa: BLE001 - the file's fate is recorded, the next file still runs
            reason = " ".join(str(exc).split()) or type(exc).__name__
        outcome = "done" if reason is None else "failed"
        target = inbox / outcome / f"{file.stem}.{run_id}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(claimed, target)
        if reason is not None:
            atomic_write_text(target.with_name(f"{target.name}.reason.txt"), reason + "\n")
            logger.error("inbox: %s failed (run %s): %s", file.name, run_id, reason)
            failures.append(f"{file.name}: {reason}")
        else:
            logger.info("inbox: %s done (run %s)", file.name, run_id)
        done[file.name] = f"{outcome}:{run_id}"
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(done)} inbox batch(es) failed: " + "; ".join(failures))
    return done
