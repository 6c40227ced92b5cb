"""A batch on one topology as flat tables of durations: what the sequencer, the local
search, the CP-SAT model and the bounds read (looked up once, indexed by position).

Pools, links and decoders are numbered in the topology's order; clips in the batch's.
A clip's *prep* is its encode + offload (on its pool's encoder pool), its *work* the
sample + handoff on its pool; for a pool that encodes for itself the two run back to
back as one block. A route is a (decoder, link) pair a pool's latents can take.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from h3flow.planner.timing import ClipLike, PlanClip, Planner


@dataclass(frozen=True)
class Instance:
    planner: Planner
    clips: list[PlanClip]
    encoder: list[int]  # per pool: the index of the pool that encodes its clips
    own: list[bool]  # per pool: it encodes its own clips
    routes: list[list[tuple[int, int]]]  # per pool: (decoder, link) for each decoder
    prep: list[list[float]]  # [clip][pool]: encode + offload, on the pool's encoder
    work: list[list[float]]  # [clip][pool]: sample + handoff, on the pool
    transfer: list[list[float]]  # [clip][link]
    decode: list[list[float]]  # [clip][decoder]: decode + mux
    kind: list[int]  # clips of one kind (spec, frames) take the same time everywhere

    @classmethod
    def of(cls, planner: Planner, clips: Sequence[ClipLike]) -> Instance:
        res = planner.resources
        plan_clips = [PlanClip.of(c) for c in clips]
        pools = res.samplers
        index = {p.name: i for i, p in enumerate(pools)}
        link_index = {lk.name: i for i, lk in enumerate(res.links)}
        kinds: dict[tuple[str, int], int] = {}
        prep, work, transfer, decode, kind = [], [], [], [], []
        for c in plan_clips:
            times = [planner.sampler_times(c, p) for p in pools]
            prep.append([t.encode + t.offload for t in times])
            work.append([t.sample + t.handoff for t in times])
            transfer.append([planner.transfer_time(c, lk) for lk in res.links])
            decode.append([sum(planner.decoder_times(c, d)) for d in res.decoders])
            kind.append(kinds.setdefault((c.spec, c.frames), len(kinds)))
        routes = [[(d, link_index[lk.name]) for d, (_, lk) in enumerate(res.routes(p))] for p in pools]
        return cls(
            planner,
            plan_clips,
            [index[p.encoder] for p in pools],
            [p.encoder == p.name for p in pools],
            routes,
            prep,
            work,
            transfer,
            decode,
            kind,
        )

    @property
    def n(self) -> int:
        return len(self.clips)

    @property
    def pools(self) -> int:
        return len(self.own)

    @property
    def borrowers(self) -> list[int]:
        return [p for p in range(self.pools) if not self.own[p]]

    @cached_property
    def tail(self) -> list[list[float]]:
        """[clip][pool]: the least a latent handed off there still needs (transfer + decode): no schedule ends
        sooner after its handoff."""
        return [
            [min(self.transfer[j][lk] + self.decode[j][d] for d, lk in self.routes[p]) for p in range(self.pools)]
            for j in range(self.n)
        ]

    def held(self, j: int, p: int) -> float:
        """What clip ``j`` costs pool ``p`` itself (its own encode included when it encodes)."""
        return self.work[j][p] + (self.prep[j][p] if self.own[p] else 0.0)
