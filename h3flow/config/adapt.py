"""config-adapt: resolve a :class:`HostMap` into a fully explicit :class:`LocalConfig`.

Pure and deterministic: the same host map gives the same local.json, byte for byte.
"""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlsplit

from h3flow.config.encoders import assign_encoders
from h3flow.config.models import (
    Database,
    DatabaseKind,
    EngineName,
    Gpu,
    Host,
    HostMap,
    Link,
    LocalConfig,
    Model,
    Pool,
    PrefectSettings,
    Receiver,
    ResolvedHost,
    ResolvedStorage,
    Route,
    Schedule,
    SecretSource,
    Storage,
    Transfer,
)
from h3flow.config.topology import DEFAULT_TOPOLOGY, Topology, parse_topology
from h3flow.core.errors import ConfigError
from h3flow.core.fsutil import sha256_json

RETAIN_CPU_WEIGHTS = "H3_MP_RETAIN_CPU_WEIGHTS"


def short_name(host: str) -> str:
    """``host-a`` -> ``a``: the stem of pool and work pool names."""
    return host.removeprefix("host-")


def visible_devices(gpus: list[Gpu]) -> dict[str, str]:
    """The environment that pins a process to these GPUs (by vendor)."""
    ids = ",".join(str(g.index) for g in gpus)
    vendor = gpus[0].vendor
    if vendor == "nvidia":
        return {"CUDA_VISIBLE_DEVICES": ids}
    if vendor == "amd":
        return {"HIP_VISIBLE_DEVICES": ids, "ROCR_VISIBLE_DEVICES": ids}
    return {"CUDA_VISIBLE_DEVICES": ""}


def main_sampler_host(hm: HostMap) -> Host:
    """The sampler host whose GPUs the topology partitions (most GPUs; first on ties)."""
    samplers = [h for h in hm.hosts if "sample" in h.roles]
    if not samplers:
        raise ConfigError("no host has the 'sample' role: nothing can sample")
    return max(samplers, key=lambda h: (len(h.gpus), -hm.hosts.index(h)))


def host_env(host: Host) -> dict[str, str]:
    env = dict(host.env)
    if "encode" in host.roles:
        env.setdefault(RETAIN_CPU_WEIGHTS, "1")
    return dict(sorted(env.items()))


def resolve_storage(storage: Storage) -> ResolvedStorage:
    root = storage.root.rstrip("/") or "/"
    return ResolvedStorage(
        root=root,
        latents=f"{root}/latents",
        conditioning=f"{root}/conditioning",
        outputs=storage.outputs or f"{root}/outputs",
    )


def _pool(hm: HostMap, host: Host, name: str, role: str, gpus: list[Gpu], port: int, encoder: str | None) -> Pool:
    degree = len(gpus) if role == "sample" else 1
    vram = sum(g.vram_gb for g in gpus)
    need = hm.model.dit_vram_gb if role == "sample" else hm.model.vae_vram_gb
    if vram < need:
        what = "the DiT (FSDP-sharded)" if role == "sample" else "the VAE"
        raise ConfigError(
            f"pool {name!r} on {host.name!r} has {vram:g} GB of VRAM over {len(gpus)} GPU(s) but {what} needs "
            f"{need:g} GB: use a larger pool or a host with more memory"
        )
    env = {**host_env(host), **visible_devices(gpus), "PREFECT_API_URL": hm.prefect.api_url}
    return Pool(
        name=name,
        work_pool=f"h3-{name}",
        role=role,
        host=host.name,
        gpus=[g.index for g in gpus],
        gpu_model=gpus[0].model,
        arch=gpus[0].arch,
        vram_gb=vram,
        ulysses_degree=degree,
        comfy_url=f"http://{host.address}:{port}",
        comfy_port=port,
        encoder_pool=encoder,
        env=dict(sorted(env.items())),
    )


def resolve_pools(hm: HostMap, topo: Topology) -> list[Pool]:
    main = main_sampler_host(hm)
    gpus = sorted(main.gpus, key=lambda g: g.index)
    if topo.gpus_used > len(gpus):
        raise ConfigError(f"topology {topo.name!r} needs {topo.gpus_used} GPUs on {main.name!r}, which has {len(gpus)}")
    if "encode" not in main.roles:
        raise ConfigError(f"main sampler host {main.name!r} has no 'encode' role: nothing can encode")
    pools: list[Pool] = []
    stem = short_name(main.name)
    sizes = sorted(topo.partition, reverse=True)
    start = 0
    for i, size in enumerate(sizes):
        name = stem if len(sizes) == 1 else f"{stem}{i}"
        pools.append(_pool(hm, main, name, "sample", gpus[start : start + size], main.comfy_port + i, None))
        start += size
    extras = [h for h in hm.hosts if "sample" in h.roles and h is not main]
    if topo.extra_samplers:
        if not extras:
            raise ConfigError(
                f"topology {topo.name!r} adds an extra sampler (xtx) but no other host has the 'sample' role"
            )
        for host in extras:
            pools.append(_pool(hm, host, short_name(host.name), "sample", host.gpus, host.comfy_port, None))
    try:
        encoders = assign_encoders(pools, {h.name: h.roles for h in hm.hosts}, hm.model.encoder_vram_gb, main.name)
    except ConfigError as exc:
        raise ConfigError(f"topology {topo.name!r}: {exc}") from None
    pools = [p.model_copy(update={"encoder_pool": encoders[p.name]}) for p in pools]
    decoders = [h for h in hm.hosts if "decode" in h.roles]
    if not decoders:
        raise ConfigError("no host has the 'decode' role: nothing can decode")
    for host in decoders:
        taken = [p for p in pools if p.host == host.name]
        dgpus = sorted(host.gpus, key=lambda g: g.index)
        if taken:  # a host that samples and decodes keeps its decoder on its last GPU
            dgpus = dgpus[-1:]
        for j, gpu in enumerate(dgpus):
            name = short_name(host.name) if len(dgpus) == 1 else f"{short_name(host.name)}{j}"
            if any(p.name == name for p in pools):
                name = f"{name}-dec"
            pools.append(_pool(hm, host, name, "decode", [gpu], host.comfy_port + len(taken) + j, None))
    return pools


def resolve_routes(hm: HostMap, pools: list[Pool]) -> list[Route]:
    routes: list[Route] = []
    sources = sorted({p.host for p in pools if p.role == "sample"})
    targets = sorted({p.host for p in pools if p.role == "decode"})
    for src in sources:
        for dst in targets:
            target = hm.host(dst)
            link = next((lk for lk in hm.links if set(lk.hosts) == {src, dst}), None)
            same = src == dst  # distinct hosts on one address (the embedded default) still transfer
            method = "local" if same else (link.method if link and link.method else hm.transfer.method)
            routes.append(
                Route(
                    source=src,
                    target=dst,
                    method=method,
                    address=target.address,
                    port=hm.transfer.port,
                    store_root=resolve_storage(target.storage).root,
                    rtt_ms=link.rtt_ms if link else (0.0 if same else 0.3),
                    gbit_s=link.gbit_s if link else (100.0 if same else 10.0),
                )
            )
    return routes


AUTH_FILE = "prefect-api.auth"
DB_PASSWORD_FILE = "postgres.password"
AUTH_ENV = "H3FLOW_PREFECT_AUTH"
DB_PASSWORD_ENV = "H3FLOW_POSTGRES_PASSWORD"


def _beside_transfer_secret(hm: HostMap, file_name: str, env_name: str) -> SecretSource:
    """A cluster secret kept where the transfer secret is: a file in the same folder, or
    (the transfer secret comes from the environment) an environment variable too."""
    secret = hm.transfer.secret
    if secret.source == "file" and secret.path:
        return SecretSource(source="file", name=file_name, path=str(Path(secret.path).parent / file_name))
    return SecretSource(source="env", name=env_name)


def resolve_prefect(hm: HostMap, embedded: bool) -> PrefectSettings:
    """The Prefect server's database and API credential.

    The embedded default keeps SQLite and an open API on loopback. A cluster gets
    PostgreSQL (run by ``start`` on the API's host) and basic auth; both secrets live
    beside the transfer secret (``start`` generates the files and copies them to the hosts).
    """
    given = hm.prefect
    if embedded:
        return given.model_copy(update={"database": given.database or Database(kind="sqlite")})
    database = given.database or Database()
    if database.kind == "postgresql" and database.password is None:
        database = database.model_copy(
            update={"password": _beside_transfer_secret(hm, DB_PASSWORD_FILE, DB_PASSWORD_ENV)}
        )
    auth = given.auth or _beside_transfer_secret(hm, AUTH_FILE, AUTH_ENV)
    return given.model_copy(update={"database": database, "auth": auth})


def adapt(hm: HostMap, topology: str | None = None, *, work_dir: str | None = None) -> LocalConfig:
    """Resolve every default and derived value of a host map."""
    topo = parse_topology(topology or hm.topology or DEFAULT_TOPOLOGY)
    pools = resolve_pools(hm, topo)
    routes = resolve_routes(hm, pools)
    receivers = sorted(
        {(r.target, hm.host(r.target).address) for r in routes if r.method == "tcp"},
    )
    hosts = {
        h.name: ResolvedHost(
            name=h.name,
            description=h.description,
            address=h.address,
            ssh_alias=h.ssh_alias or h.name,
            user=h.user,
            port=h.port,
            venv=h.venv,
            comfy_dir=h.comfy_dir,
            raylight_dir=h.raylight_dir,
            roles=h.roles,
            gpus=sorted(h.gpus, key=lambda g: g.index),
            storage=resolve_storage(h.storage),
            env=host_env(h),
        )
        for h in hm.hosts
    }
    return LocalConfig(
        generated_by="h3flow config-adapt",
        source_sha256=sha256_json(hm.model_dump(mode="json")),
        engine=hm.engine,
        topology=topo.name,
        topology_canonical=topo.canonical,
        prefect=resolve_prefect(hm, embedded=work_dir is not None),
        model=hm.model,
        runs_dir=hm.runs_dir or f"{resolve_storage(main_sampler_host(hm).storage).root}/runs",
        hosts=hosts,
        pools=pools,
        routes=routes,
        receivers=[Receiver(host=h, bind=addr, port=hm.transfer.port) for h, addr in receivers],
        transfer=hm.transfer,
        work_dir=work_dir,
    )


# --------------------------------------------------------------------------- embedded default
def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(base: int, count: int) -> int:
    """The first port >= ``base`` such that ``count`` consecutive ports are free right now."""
    port = base
    while port + count - 1 <= 65535:
        busy = next((p for p in range(port, port + count) if not _free(p)), None)
        if busy is None:
            return port
        port = busy + 1
    raise ConfigError(f"no {count} consecutive free ports from {base}")


LOCAL_PORTS = 5  # the embedded default's block: Prefect, the receiver, ComfyUI a0 / a1 (host A), b (host B)


def local_ports(first: int) -> tuple[int, int, int, int]:
    """(Prefect API, receiver, host A's first ComfyUI, host B's ComfyUI) in a block from ``first``."""
    return first, first + 1, first + 2, first + 4


def local_host_map(
    work_dir: Path,
    base_port: int = 14200,
    venv: str | None = None,
    engine: EngineName = "local",
    database: DatabaseKind = "sqlite",
) -> HostMap:
    """The embedded default: every host is this machine, on loopback, under ``work_dir``.

    Host A has two CPU "devices" (two degree-1 sampler pools, like four_four_plus_one
    in miniature); host B decodes. The reference model stands in for H3: in-process
    (``engine="local"``) or in one real local ComfyUI per pool (``"comfy"``, on the
    pool's comfy_port; `h3flow start --local` installs and starts them). The Prefect
    server keeps SQLite (nothing to install), or ``database="postgresql"``: Debian's
    PostgreSQL run by ``start`` as on a cluster, which answers a busy batch's API calls
    several times faster (docs/pipeline.md, "Where the time goes").
    """
    import sys

    wd = work_dir.resolve()
    first = free_port_block(base_port, LOCAL_PORTS)
    prefect_port, receiver_port, comfy_a, comfy_b = local_ports(first)
    cpu = [Gpu(index=0, model="cpu", vram_gb=1, arch="cpu"), Gpu(index=1, model="cpu", vram_gb=1, arch="cpu")]
    py_venv = venv or str(Path(sys.prefix))

    def host(name: str, roles: list[str], gpus: list[Gpu], comfy_port: int) -> Host:
        return Host(
            name=name,
            description="this machine (embedded default)",
            address="127.0.0.1",
            ssh_alias=None,
            venv=py_venv,
            comfy_dir=str(wd / "comfyui" / name),
            comfy_port=comfy_port,
            gpus=gpus,
            roles=roles,
            storage=Storage(root=str(wd / "store" / name)),
        )

    return HostMap(
        engine=engine,
        topology="one_one_plus_one",
        prefect=PrefectSettings(
            api_url=f"http://127.0.0.1:{prefect_port}/api",
            schedule=Schedule(cron="0 3 * * *", timezone="UTC", inbox=str(wd / "inbox")),
            database=_local_database(wd, first + LOCAL_PORTS) if database == "postgresql" else None,
        ),
        model=Model(
            kind="reference",
            text_encoder="reference",
            dit="reference",
            lora=None,
            vae="reference-int8",
            dit_vram_gb=0.1,
            vae_vram_gb=0.1,
            encoder_vram_gb=0.1,
        ),
        hosts=[
            host("host-a", ["encode", "sample"], cpu, comfy_a),
            host("host-b", ["decode"], [Gpu(index=0, model="cpu", vram_gb=1, arch="cpu")], comfy_b),
        ],
        transfer=Transfer(
            method="tcp",
            port=receiver_port,
            secret=SecretSource(source="file", name="transfer", path=str(wd / "secrets" / "transfer.key")),
        ),
        runs_dir=str(wd / "runs"),
    )


def _local_database(work_dir: Path, base_port: int) -> Database:
    """PostgreSQL for the embedded default: a free loopback port, its password in the work dir's secrets."""
    password = SecretSource(source="file", name="postgres", path=str(work_dir / "secrets" / DB_PASSWORD_FILE))
    return Database(kind="postgresql", port=free_port_block(base_port, 1), password=password)


def on_free_ports(config: LocalConfig, base_port: int | None = None) -> LocalConfig:
    """The embedded default moved to a block of ports free right now, everything else as
    it was: what ``start --local`` does when another process holds its ports (another
    checkout's services, say) and none of its own run. The block is the first free one from
    ``base_port``, by default past the whole current block (the other checkout most likely
    has the same one, ComfyUI and PostgreSQL ports included)."""
    if not config.work_dir:
        raise ConfigError("only the embedded default (a local.json with a work_dir) picks its own ports")
    if base_port is None:
        base_port = (urlsplit(config.prefect.api_url).port or 0) + LOCAL_PORTS + 1
    hm = host_map_of(config)
    first = free_port_block(base_port, LOCAL_PORTS)
    prefect_port, receiver_port, comfy_a, comfy_b = local_ports(first)
    comfy = {"host-a": comfy_a, "host-b": comfy_b}
    hosts = [h.model_copy(update={"comfy_port": comfy.get(h.name, h.comfy_port)}) for h in hm.hosts]
    database = hm.prefect.database
    if database is not None and database.kind == "postgresql":
        database = database.model_copy(update={"port": free_port_block(first + LOCAL_PORTS, 1)})
    prefect = hm.prefect.model_copy(update={"api_url": f"http://127.0.0.1:{prefect_port}/api", "database": database})
    transfer = hm.transfer.model_copy(update={"port": receiver_port})
    moved = hm.model_copy(update={"hosts": hosts, "prefect": prefect, "transfer": transfer})
    return adapt(moved, config.topology, work_dir=config.work_dir)


def host_map_of(config: LocalConfig) -> HostMap:
    """The hardware a local.json describes, as a host map (so `plan` can try other topologies)."""
    links = {frozenset((r.source, r.target)): (r.rtt_ms, r.gbit_s) for r in config.routes if r.source != r.target}
    return HostMap(
        engine=config.engine,
        topology=config.topology,
        prefect=config.prefect,
        model=config.model,
        hosts=[
            Host(
                name=h.name,
                description=h.description,
                address=h.address,
                ssh_alias=h.ssh_alias,
                user=h.user,
                port=h.port,
                venv=h.venv,
                comfy_dir=h.comfy_dir,
                raylight_dir=h.raylight_dir,
                gpus=h.gpus,
                roles=h.roles,
                storage=Storage(root=h.storage.root, outputs=h.storage.outputs),
                env=h.env,
            )
            for h in config.hosts.values()
        ],
        links=[
            Link(hosts=tuple(sorted(k)), rtt_ms=v[0], gbit_s=v[1])
            for k, v in sorted(links.items(), key=lambda kv: sorted(kv[0]))
        ],
        transfer=config.transfer,
        runs_dir=config.runs_dir,
    )


def render(config: LocalConfig) -> dict[str, object]:
    """local.json's JSON form: what ``config-adapt`` writes and ``--check`` compares."""
    return config.model_dump(mode="json")
