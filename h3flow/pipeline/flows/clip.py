"""The per-clip flows that run on the pools' workers.

``sample-clip`` runs on a sampler pool: encode → offload → sample → transfer to the
decoder host. ``decode-clip`` runs on the decoder: verify → decode → MP4. Each
publishes its stage records as a table artifact (visible in the UI, and how the
dispatcher on another host learns the latent's SHA-256 without shared storage).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import create_table_artifact

from h3flow.config.models import LocalConfig, config_at
from h3flow.config.settings import settings
from h3flow.core.batch import Clip
from h3flow.core.errors import ConfigError, IntegrityError
from h3flow.core.fsutil import file_lock, sha256_file
from h3flow.engines import engine_for
from h3flow.pipeline.tasks import keys, stages

CORRUPT = "latent-corrupt"


def config_path_or_env(config_path: str | None) -> str:
    path = config_path or settings().config
    if not path:
        raise ConfigError("no config: pass config_path or set H3FLOW_CONFIG")
    return str(Path(path).resolve())


@contextlib.contextmanager
def pool_lock(config: LocalConfig, pool: str) -> Iterator[None]:
    """One clip at a time on a pool's devices, so a run queued ahead only hides start-up."""
    host = config.pool(pool).host
    with file_lock(Path(config.hosts[host].storage.root) / "locks" / f"{pool}.lock"):
        yield


def file_ok(result: dict[str, Any]) -> bool:
    path = Path(result["path"])
    return path.exists() and sha256_file(path) == result["sha256"]


def run_stage(
    task: Any, results: Path, verify: Callable[[dict[str, Any]], bool] | None, **params: Any
) -> dict[str, Any]:
    """Run a cached task; a cache hit whose file is gone or damaged is recomputed."""
    configured = task.with_options(result_storage=results, cache_policy=stages.host_cache(results))
    state = configured(**params, return_state=True)
    result = dict(state.result())
    cached = state.name == "Cached"
    if cached and verify is not None and not verify(result):
        result = dict(configured.with_options(refresh_cache=True)(**params))
        cached = False
    result["cached"] = cached
    return result


def publish(kind: str, run_id: str, clip_id: str, records: dict[str, dict[str, Any]]) -> None:
    rows = [
        {"stage": stage, **{k: v for k, v in rec.items() if k != "free_per_device"}} for stage, rec in records.items()
    ]
    create_table_artifact(table=rows, description=f"h3flow {kind} · run {run_id} · clip {clip_id}")


@flow(name="sample-clip", log_prints=True)
def sample_clip(
    run_id: str,
    clip: dict[str, Any],
    pool: str,
    decoder: str,
    config_path: str | None = None,
    retransfer: bool = False,
) -> dict[str, dict[str, Any]]:
    """encode → offload → sample → transfer for one clip on one sampler pool."""
    path = config_path_or_env(config_path)
    config = config_at(path)
    clip_ = Clip.model_validate(clip)
    pool_ = config.pool(pool)
    results = Path(config.hosts[pool_.host].storage.root) / "prefect-results"
    common = {"clip": clip, "pool": pool, "config_path": path}
    records: dict[str, dict[str, Any]] = {}
    engine_for(config, config.pool(pool).encoder_pool or pool)  # imports + weights load while the
    engine_for(config, pool)  # pool's previous clip still holds the lock: start-up stays hidden
    with pool_lock(config, pool):
        records["encode"] = run_stage(
            stages.encode, results, file_ok, key=keys.encode_key(clip_, config.model), **common
        )
        records["offload"] = stages.offload(pool=pool, config_path=path)
        records["sample"] = run_stage(
            stages.sample,
            results,
            file_ok,
            conditioning=records["encode"],
            key=keys.sample_key(clip_, config.model, records["encode"]["sha256"]),
            **common,
        )
    target = config.pool(decoder).host
    transfer = stages.transfer.with_options(refresh_cache=True) if retransfer else stages.transfer
    records["transfer"] = run_stage(
        transfer,
        results,
        None,
        latent=records["sample"],
        clip_id=clip_.id,
        pool=pool,
        decoder=decoder,
        config_path=path,
        key=keys.transfer_key(records["sample"]["sha256"], target, config.hosts[target].storage.root),
    )
    publish("sample-clip", run_id, clip_.id, records)
    return records


@flow(name="decode-clip", log_prints=True)
def decode_clip(
    run_id: str, clip_id: str, latent_sha256: str, decoder: str, config_path: str | None = None
) -> dict[str, dict[str, Any]]:
    """verify → decode → MP4, linked as ``<outputs>/<run_id>/<clip_id>.mp4``."""
    from h3flow.handoff.store import LatentStore

    path = config_path_or_env(config_path)
    config = config_at(path)
    pool_ = config.pool(decoder)
    storage = config.hosts[pool_.host].storage
    results = Path(storage.root) / "prefect-results"
    store = LatentStore(Path(storage.root))
    latent = store.path_for(latent_sha256)
    if not latent.exists() or sha256_file(latent) != latent_sha256:
        latent.unlink(missing_ok=True)  # a damaged copy must be re-sent, never decoded
        raise IntegrityError(f"{CORRUPT}: latent {latent_sha256[:12]} on {pool_.host} is missing or damaged")
    engine_for(config, decoder)  # start-up outside the lock, hidden behind the running decode
    with pool_lock(config, decoder):
        record = run_stage(
            stages.decode,
            results,
            file_ok,
            latent_sha256=latent_sha256,
            clip_id=clip_id,
            decoder=decoder,
            config_path=path,
            key=keys.decode_key(latent_sha256, config.model),
        )
    final = Path(storage.outputs) / run_id / f"{clip_id}.mp4"
    link_verified(Path(record["path"]), final, record["sha256"])
    record = {**record, "path": str(final)}
    publish("decode-clip", run_id, clip_id, {"decode": record})
    return {"decode": record}


def link_verified(source: Path, target: Path, sha256: str) -> None:
    """Give a content-addressed file its per-run name (hard link, else copy); never clobber other bytes."""
    import shutil

    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        if sha256_file(target) == sha256:
            return
        raise ConfigError(f"{target} exists with other content; not overwriting it")
    tmp = target.with_name(f".tmp-{target.name}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)
