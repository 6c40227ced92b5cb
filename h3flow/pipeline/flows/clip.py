"""The per-clip flows that run on the pools' workers.

``sample-clip`` runs on a sampler pool: encode → offload → sample → transfer to the
decoder host. ``decode-clip`` runs on the decoder: verify → decode → MP4. Each
publishes its :class:`~h3flow.pipeline.results.StageResult` rows as a table artifact —
on failure too, with the failed stage's :class:`~h3flow.pipeline.results.FailureKind` —
which is how the dispatcher on another host learns the outcome without shared storage
(and what the UI shows). A flow whose run was asked to stop (cancelled in Prefect) ends
Cancelled at its next stage boundary (:mod:`h3flow.pipeline.stopping`).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import create_table_artifact
from prefect.states import Cancelled, State

from h3flow.config.models import config_at
from h3flow.config.settings import settings
from h3flow.core.batch import Clip
from h3flow.core.errors import ConfigError, IntegrityError
from h3flow.core.files import file_intact
from h3flow.core.fsutil import atomic_path
from h3flow.engines import engine_for
from h3flow.pipeline.deadlines import Deadlines, deadlines
from h3flow.pipeline.gpu_slot import gpu_slot
from h3flow.pipeline.params import Budget
from h3flow.pipeline.results import StageResult, classify
from h3flow.pipeline.stopping import StopRequested, checkpoint
from h3flow.pipeline.tasks import keys, stages


def config_path_or_env(config_path: str | None) -> str:
    path = config_path or settings().config
    if not path:
        raise ConfigError("no config: pass config_path or set H3FLOW_CONFIG")
    return str(Path(path).resolve())


class StageFailed(Exception):
    """A stage's exception, tagged with the stage it came from."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        super().__init__(f"{stage}: {cause}")
        self.stage, self.cause = stage, cause


def run_stage(task: Any, results: Path, budget: Budget, limits: Deadlines, stage: str, **params: Any) -> StageResult:
    """Run a cached task within the clip's budget and the stage's deadline, at a stage boundary (a
    stopped run stops here); a cache hit whose file is gone or damaged is recomputed."""
    checkpoint()
    left = budget.left(stage)
    configured = task.with_options(
        result_storage=results,
        cache_policy=stages.host_cache(results),
        retries=max(0, left - 1),
        timeout_seconds=limits.of(stage),
    )
    try:
        state = configured(**params, allowed=left > 0, return_state=True)
        result = StageResult.model_validate(state.result())
        cached = state.name == "Cached"
        if cached and result.path is not None and not file_intact(result.path, result.sha256, result.size):
            result = StageResult.model_validate(configured.with_options(refresh_cache=True)(**params, allowed=left > 0))
            cached = False
    except Exception as exc:
        raise StageFailed(stage, exc) from exc
    return result.model_copy(update={"cached": cached, "tries": 0 if cached else result.tries})


@contextlib.contextmanager
def reported(kind: str, run_id: str, clip_id: str) -> Iterator[dict[str, StageResult]]:
    """Collect a flow's stage results and publish them as its table artifact, also when a stage fails
    or the run is stopped.

    A failure adds a row for the failed stage with its kind and one-line reason; the
    exception still fails the flow run.
    """
    results: dict[str, StageResult] = {}
    try:
        yield results
    except StopRequested:
        raise
    except StageFailed as failed:
        results[failed.stage] = StageResult(stage=failed.stage, failure=classify(failed.cause), error=str(failed.cause))
        raise failed.cause from None
    except Exception as exc:  # before any stage: the engine or the config
        results["setup"] = StageResult(stage="setup", failure=classify(exc), error=str(exc))
        raise
    finally:
        rows = [r.row() for r in results.values()]
        create_table_artifact(table=rows, description=f"h3flow {kind} · run {run_id} · clip {clip_id}")


Outcome = dict[str, dict[str, Any]] | State[Any]
"""A clip flow's return: its stage rows, or the Cancelled state it stopped in."""


@flow(name="sample-clip", log_prints=True)
def sample_clip(
    run_id: str,
    clip: Clip,
    pool: str,
    decoder: str,
    config_path: str | None = None,
    retransfer: bool = False,
    budget: Budget = Budget(),
) -> Outcome:
    """encode → offload → sample → transfer for one clip on one sampler pool.

    Args:
        run_id: the h3flow run this clip belongs to
        clip: the clip (prompt, image and its SHA-256, spec, seconds, seed)
        pool: the sampler pool that runs it (its deployment's)
        decoder: the decoder pool whose host receives the latent
        config_path: local.json on this host (default: $H3FLOW_CONFIG)
        retransfer: send the latent again even if the decoder is recorded as having it
        budget: per stage, the prompt submissions still allowed for this clip
    """
    path = config_path_or_env(config_path)
    config = config_at(path)
    pool_ = config.pool(pool)
    results = Path(config.hosts[pool_.host].storage.root) / "prefect-results"
    common = {"clip": clip.model_dump(mode="json"), "pool": pool, "config_path": path}
    limits = deadlines(config, clip, pool, decoder)
    try:
        with reported("sample-clip", run_id, clip.id) as done:
            engine_for(config, pool_.encoder_pool or pool)  # warm in an h3flow worker: loaded when it started
            engine_for(config, pool)
            with gpu_slot(pool):
                done["encode"] = run_stage(
                    stages.encode, results, budget, limits, "encode", key=keys.encode_key(clip, config.model), **common
                )
                try:
                    done["offload"] = stages.offload.with_options(timeout_seconds=limits.offload)(
                        pool=pool, config_path=path
                    )
                except Exception as exc:
                    raise StageFailed("offload", exc) from exc
                done["sample"] = run_stage(
                    stages.sample,
                    results,
                    budget,
                    limits,
                    "sample",
                    conditioning=done["encode"],
                    key=keys.sample_key(clip, config.model, done["encode"].sha256 or ""),
                    **common,
                )
            target = config.pool(decoder).host
            transfer = stages.transfer.with_options(refresh_cache=True) if retransfer else stages.transfer
            done["transfer"] = run_stage(
                transfer,
                results,
                budget,
                limits,
                "transfer",
                latent=done["sample"],
                clip_id=clip.id,
                pool=pool,
                decoder=decoder,
                config_path=path,
                key=keys.transfer_key(done["sample"].sha256 or "", target, config.hosts[target].storage.root),
            )
    except StopRequested as stop:
        return Cancelled(message=f"stopped at a stage boundary: {stop}")
    return {stage: r.row() for stage, r in done.items()}


@flow(name="decode-clip", log_prints=True)
def decode_clip(
    run_id: str,
    clip: Clip,
    latent_sha256: str,
    decoder: str,
    config_path: str | None = None,
    budget: Budget = Budget(),
) -> Outcome:
    """verify → decode → MP4, delivered as ``<outputs>/<run_id>/<clip_id>.mp4``.

    Args:
        run_id: the h3flow run this clip belongs to
        clip: the clip (its spec and length set the decode's deadline)
        latent_sha256: the latent to decode, in this decoder host's store
        decoder: the decoder pool that runs it (its deployment's)
        config_path: local.json on this host (default: $H3FLOW_CONFIG)
        budget: per stage, the prompt submissions still allowed for this clip
    """
    from h3flow.handoff.store import LatentStore

    path = config_path_or_env(config_path)
    config = config_at(path)
    pool_ = config.pool(decoder)
    storage = config.hosts[pool_.host].storage
    results = Path(storage.root) / "prefect-results"
    latent = LatentStore(Path(storage.root)).path_for(latent_sha256)
    clip_id = clip.id
    limits = deadlines(config, clip, config.samplers[0].name, decoder)
    try:
        with reported("decode-clip", run_id, clip_id) as done:
            if not file_intact(latent, latent_sha256):
                latent.unlink(missing_ok=True)  # a damaged copy must be re-sent, never decoded
                missing = IntegrityError(f"latent {latent_sha256[:12]} on {pool_.host} is missing or damaged")
                raise StageFailed("decode", missing)
            engine_for(config, decoder)
            with gpu_slot(decoder):
                record = run_stage(
                    stages.decode,
                    results,
                    budget,
                    limits,
                    "decode",
                    latent_sha256=latent_sha256,
                    clip_id=clip_id,
                    decoder=decoder,
                    config_path=path,
                    key=keys.decode_key(latent_sha256, config.model),
                )
            final = Path(storage.outputs) / run_id / f"{clip_id}.mp4"
            deliver(Path(record.path or ""), final, record.sha256 or "")
            done["decode"] = record.model_copy(update={"path": str(final)})
    except StopRequested as stop:
        return Cancelled(message=f"stopped at a stage boundary: {stop}")
    return {stage: r.row() for stage, r in done.items()}


def deliver(source: Path, target: Path, sha256: str) -> None:
    """Give a content-addressed MP4 its per-run name as a file of its own (a copy, never a link), so
    editing or damaging a delivered video cannot reach the cache or other runs; never clobber other bytes."""
    if target.exists():
        if file_intact(target, sha256):
            return
        raise ConfigError(f"{target} exists with other content; not overwriting it (move it aside and resume)")
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)
    if not file_intact(target, sha256):
        target.unlink(missing_ok=True)
        raise IntegrityError(f"{source} changed while it was delivered to {target}")
