"""The resources a topology gives the planner: sampler pools, links, decoders.

Built from a resolved ``local.json`` (:class:`~h3flow.config.models.LocalConfig`), so the plan
and the live pipeline see the same pools. A sampler pool samples one clip at a time; a
pool that cannot hold the text encoder (the XTX box, or a 2-GPU pool) has its clips
encoded on its ``encoder`` pool, which spends that time on them; each (sampler host,
decoder host) pair shares one link; each decoder decodes one clip at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from h3flow.config.models import LocalConfig
from h3flow.core.errors import ConfigError


@dataclass(frozen=True)
class SamplerPool:
    name: str
    host: str
    gpu_model: str
    degree: int
    vram_gb: float
    encoder: str  # the pool whose GPUs encode this pool's clips (itself when it can)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.degree}×{self.gpu_model})"


@dataclass(frozen=True)
class Decoder:
    name: str
    host: str
    gpu_model: str

    @property
    def label(self) -> str:
        return f"{self.name} ({self.gpu_model})"


@dataclass(frozen=True)
class Link:
    name: str
    source: str
    target: str
    gbit_s: float

    @property
    def label(self) -> str:
        return f"link {self.source}→{self.target}"


@dataclass(frozen=True)
class Resources:
    """One topology's resources, in a stable order (the Gantt chart's lanes)."""

    topology: str
    canonical: str
    samplers: tuple[SamplerPool, ...]
    decoders: tuple[Decoder, ...]
    links: tuple[Link, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_pool", {p.name: p for p in self.samplers})
        object.__setattr__(self, "_link", {(lk.source, lk.target): lk for lk in self.links})

    def pool(self, name: str) -> SamplerPool:
        try:
            return self._pool[name]  # type: ignore[attr-defined]
        except KeyError:
            raise ConfigError(f"unknown sampler pool {name!r} (known: {', '.join(self._pool)})") from None  # type: ignore[attr-defined]

    def routes(self, pool: SamplerPool) -> list[tuple[Decoder, Link]]:
        """Each decoder with the link a latent from ``pool`` takes to reach it."""
        cache: dict[str, list[tuple[Decoder, Link]]] = self.__dict__.setdefault("_routes", {})
        if pool.name not in cache:
            cache[pool.name] = [(d, self.link(pool.host, d.host)) for d in self.decoders]
        return cache[pool.name]

    def link(self, source_host: str, target_host: str) -> Link:
        return self._link[(source_host, target_host)]  # type: ignore[attr-defined]

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.samplers] + [lk.name for lk in self.links] + [d.name for d in self.decoders]

    @classmethod
    def from_config(cls, config: LocalConfig) -> Resources:
        """The topology in ``config``, with the encoder pools config-adapt assigned (what the pipeline runs)."""
        pools = config.samplers
        if not pools:
            raise ConfigError(f"topology {config.topology!r} has no sampler pool")
        names = {p.name for p in pools}
        samplers: list[SamplerPool] = []
        for pool in pools:
            encoder = pool.encoder_pool or pool.name
            if encoder not in names:
                raise ConfigError(
                    f"pool {pool.name!r}: its encoder pool {encoder!r} is not a sampler pool of the config"
                )
            samplers.append(
                SamplerPool(pool.name, pool.host, pool.gpu_model, pool.ulysses_degree, pool.vram_gb, encoder)
            )
        decoders = tuple(Decoder(p.name, p.host, p.gpu_model) for p in config.pools if p.role == "decode")
        if not decoders:
            raise ConfigError(f"topology {config.topology!r} has no decoder")
        links = []
        for route in config.routes:
            if any(s.host == route.source for s in samplers) and any(d.host == route.target for d in decoders):
                links.append(Link(f"{route.source}->{route.target}", route.source, route.target, route.gbit_s))
        have = {(lk.source, lk.target) for lk in links}
        for s in samplers:
            for d in decoders:
                if (s.host, d.host) not in have:
                    raise ConfigError(f"no route from {s.host!r} to {d.host!r} in the config")
        return cls(config.topology, config.topology_canonical, tuple(samplers), decoders, tuple(links))
