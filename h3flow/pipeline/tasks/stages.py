"""encode → offload → sample → transfer → decode as Prefect tasks.

Every task takes plain JSON values (a clip as a dict, pool names, the config path and
the stage's content key) and returns a :class:`~h3flow.pipeline.results.StageResult`: a
file on the host named by its SHA-256, plus where and how long it ran. Results are
persisted as JSON in a host-local result store, so a cache hit hands back the file's
address, never a tensor.

Retries: this is the one layer that retries a transient failure (a dropped connection,
a timeout, a restarted service) — up to the clip's remaining budget of
:data:`~h3flow.core.contracts.MAX_SUBMISSIONS` tries, with back-off. The engines never
retry; bad input and full disks are never retried (docs/pipeline.md, "Retries").
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import CacheKeyFnPolicy
from prefect.context import TaskRunContext

from h3flow.config.models import LocalConfig, config_at
from h3flow.core.batch import Clip
from h3flow.core.contracts import MAX_SUBMISSIONS
from h3flow.core.errors import IntegrityError
from h3flow.core.files import FileRef, file_intact
from h3flow.core.fsutil import sha256_file
from h3flow.engines import engine_for
from h3flow.pipeline.results import BudgetSpent, FailureKind, StageResult, classify
from h3flow.pipeline.tasks.locks import ProcessLockManager

RETRY_DELAYS: list[float] = [1, 3, 9]


def retry_transient(task_: Any, task_run: Any, state: Any) -> bool:
    """Prefect retry condition: retry only what may succeed on a second try."""
    try:
        state.result()
    except Exception as exc:  # noqa: BLE001 - we classify, not handle
        return classify(exc) is FailureKind.TRANSIENT
    return False


def tries_so_far() -> int:
    """This task run's attempt number (1 on the first try): the submissions it made."""
    from prefect.runtime import task_run

    return int(task_run.run_count or 1)


def check_budget(allowed: bool, stage: str) -> None:
    """Called first in a task body, which runs only on a cache miss: a spent budget stops it there."""
    if not allowed:
        raise BudgetSpent(f"{stage}: every allowed submission of this clip's {stage} has been used")


def key_from_parameters(_ctx: TaskRunContext, parameters: dict[str, Any]) -> str:
    return f"{parameters['stage_name']}-{parameters['key']}"


def host_cache(results: Path) -> Any:
    """The content-key cache on one host: records beside the results, SERIALIZABLE.

    SERIALIZABLE with a host-local lock means two flow runs that reach the same stage
    key at once (a resumed run beside a still-running child) compute it once; the second
    waits and gets the cached result.
    """
    return CacheKeyFnPolicy(cache_key_fn=key_from_parameters).configure(
        key_storage=results / "keys",
        isolation_level="SERIALIZABLE",
        lock_manager=ProcessLockManager(results / "locks"),
    )


def journal(config: LocalConfig, host: str, stage: str, clip_id: str, pool: str) -> None:
    """Append one line per real engine invocation (what resume tests count)."""
    path = Path(config.hosts[host].storage.root) / "journal.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"t": time.time(), "stage": stage, "clip": clip_id, "pool": pool, "pid": os.getpid()})
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")


def adopt(tmp: Path, directory: Path, suffix: str) -> FileRef:
    """Rename a freshly written file to its content address ``<sha>.<suffix>`` in ``directory``.

    An existing file of that name is kept only if its bytes still hash to its name; a
    damaged one is replaced by the fresh file, never trusted.
    """
    sha = sha256_file(tmp)
    target = directory / f"{sha}{suffix}"
    if file_intact(target, sha):
        tmp.unlink()
    else:
        os.replace(tmp, target)
    return FileRef(target, sha, target.stat().st_size)


def stage_result(stage: str, ref: FileRef | None, host: str, pool: str, started: float, **extra: Any) -> StageResult:
    files = ref.to_json() if ref is not None else {}
    return StageResult(
        stage=stage,
        host=host,
        pool=pool,
        started=started,
        seconds=round(time.time() - started, 3),
        tries=tries_so_far(),
        **files,
        **extra,
    )


STAGE_OPTIONS: dict[str, Any] = dict(
    retries=MAX_SUBMISSIONS - 1,  # the flow lowers it to the clip's remaining budget
    retry_delay_seconds=RETRY_DELAYS,
    retry_condition_fn=retry_transient,
    cache_policy=CacheKeyFnPolicy(cache_key_fn=key_from_parameters),  # host_cache() per host at run time
    persist_result=True,
    result_serializer="json",
)


@task(name="encode", **STAGE_OPTIONS)
def encode(
    clip: dict[str, Any], pool: str, config_path: str, key: str, allowed: bool = True, stage_name: str = "encode"
) -> StageResult:
    """Prompt + reference image → conditioning file, on the pool that encodes for ``pool``."""
    from h3flow.handoff.inputs import image_on_this_host

    check_budget(allowed, "encode")
    config = config_at(config_path)
    encoder = config.pool(config.pool(pool).encoder_pool or pool)
    started = time.time()
    # this process runs on the sampler pool's host (the encoder pool's, or its own when it
    # borrows one): `run` stages the images to both
    here = config.pool(pool).host
    clip_ = image_on_this_host(Clip.model_validate(clip), Path(config.hosts[here].storage.root), here)
    directory = Path(config.hosts[encoder.host].storage.conditioning)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".tmp-{clip_.id}-{uuid.uuid4().hex}.safetensors"
    journal(config, encoder.host, "encode", clip_.id, encoder.name)
    try:
        engine_for(config, encoder.name).encode(clip_, tmp)
        ref = adopt(tmp, directory, ".safetensors")
    finally:
        tmp.unlink(missing_ok=True)
    return stage_result("encode", ref, encoder.host, encoder.name, started)


@task(name="offload", retries=MAX_SUBMISSIONS - 1, retry_delay_seconds=RETRY_DELAYS, retry_condition_fn=retry_transient)
def offload(pool: str, config_path: str) -> StageResult:
    """Free the encoder's VRAM before sampling and check what is free per device."""
    config = config_at(config_path)
    encoder = config.pool(config.pool(pool).encoder_pool or pool)
    started = time.time()
    report = engine_for(config, encoder.name).offload()
    return stage_result(
        "offload",
        None,
        encoder.host,
        encoder.name,
        started,
        freed_bytes=report.freed_bytes,
        free_per_device=report.free_per_device,
        kept_cpu_copy=report.kept_cpu_copy,
    )


@task(name="sample", **STAGE_OPTIONS)
def sample(
    clip: dict[str, Any],
    conditioning: StageResult,
    pool: str,
    config_path: str,
    key: str,
    allowed: bool = True,
    stage_name: str = "sample",
) -> StageResult:
    """Conditioning + seed → .h3latent in the sampler host's content-addressed store."""
    from h3flow.handoff.store import LatentStore

    check_budget(allowed, "sample")
    config = config_at(config_path)
    pool_ = config.pool(pool)
    started = time.time()
    clip_ = Clip.model_validate(clip)
    store = LatentStore(Path(config.hosts[pool_.host].storage.root))
    tmp_dir = Path(config.hosts[pool_.host].storage.root) / "tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f"{clip_.id}-{uuid.uuid4().hex}.h3latent"
    journal(config, pool_.host, "sample", clip_.id, pool)
    try:
        engine_for(config, pool).sample(clip_, conditioning.file, tmp)
        ref = store.put_file(tmp, move=True)
    finally:
        tmp.unlink(missing_ok=True)
    return stage_result("sample", ref, pool_.host, pool, started)


@task(name="transfer", **STAGE_OPTIONS)
def transfer(
    latent: StageResult,
    clip_id: str,
    pool: str,
    decoder: str,
    config_path: str,
    key: str,
    allowed: bool = True,
    stage_name: str = "transfer",
) -> StageResult:
    """Send the latent to the decoder host's store; both ends check the SHA-256."""
    from h3flow.handoff.transfer import send

    check_budget(allowed, "transfer")
    config = config_at(config_path)
    source, target = config.pool(pool).host, config.pool(decoder).host
    started = time.time()
    journal(config, source, "transfer", clip_id, pool)
    ref = send(latent.file, destination_for(config, source, target))
    return stage_result("transfer", ref, target, decoder, started, method=config.route(source, target).method)


def destination_for(config: LocalConfig, source_host: str, target_host: str) -> Any:
    from h3flow.config.secret import load_secret
    from h3flow.handoff.destination import Destination

    route = config.route(source_host, target_host)
    target = config.hosts[target_host]
    return Destination(
        method=route.method,
        host=target_host,
        address=route.address,
        port=route.port,
        ssh_alias=target.ssh_alias,
        store_root=Path(route.store_root),
        secret=load_secret(config.transfer.secret) if route.method == "tcp" else None,
    )


@task(name="decode", **STAGE_OPTIONS)
def decode(
    latent_sha256: str,
    clip_id: str,
    decoder: str,
    config_path: str,
    key: str,
    allowed: bool = True,
    stage_name: str = "decode",
) -> StageResult:
    """A verified latent from this host's store → H.264 + AAC MP4 (content-addressed)."""
    from h3flow.handoff.store import LatentStore

    check_budget(allowed, "decode")
    config = config_at(config_path)
    pool_ = config.pool(decoder)
    storage = config.hosts[pool_.host].storage
    store = LatentStore(Path(storage.root))
    path = store.path_for(latent_sha256)
    if not path.exists():
        raise IntegrityError(f"latent {latent_sha256[:12]} is not in {pool_.host}'s store")
    started = time.time()
    directory = Path(storage.outputs) / "by-hash"
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".tmp-{clip_id}-{uuid.uuid4().hex}.mp4"
    journal(config, pool_.host, "decode", clip_id, decoder)
    try:
        engine_for(config, decoder).decode(FileRef(path, latent_sha256, path.stat().st_size), tmp)
        ref = adopt(tmp, directory, ".mp4")
    finally:
        tmp.unlink(missing_ok=True)
    return stage_result("decode", ref, pool_.host, decoder, started)
