"""Stage durations of a clip on a topology's resources, from a profile (plus live measurements)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from h3flow.core.specs import frames_for_seconds
from h3flow.planner.profile import Profile
from h3flow.planner.resources import Decoder, Link, Resources, SamplerPool

Measured = Mapping[tuple[str, str, str], float]
"""Live overrides: (resource name, stage, spec) -> seconds for a profile-length clip."""


class ClipLike(Protocol):
    """What the planner needs of a clip (``h3flow.core.batch.Clip`` has it)."""

    @property
    def id(self) -> str: ...
    @property
    def spec(self) -> str: ...
    @property
    def frames(self) -> int: ...


@dataclass(frozen=True, slots=True)
class PlanClip:
    """A clip as the planner sees it: its id, spec and (snapped) frame count, precomputed."""

    id: str
    spec: str
    frames: int

    @classmethod
    def of(cls, clip: ClipLike) -> PlanClip:
        return clip if isinstance(clip, PlanClip) else cls(clip.id, clip.spec, clip.frames)

    @classmethod
    def make(cls, id: str, spec: str = "sd", seconds: float = 5.0) -> PlanClip:
        return cls(id, spec, frames_for_seconds(seconds))


@dataclass(frozen=True, slots=True)
class SamplerTimes:
    """A clip's sampler-side stages: encode + offload on the encoder pool, then sample + handoff."""

    encode: float
    offload: float
    sample: float
    handoff: float

    @property
    def total(self) -> float:
        return self.encode + self.offload + self.sample + self.handoff


class Planner:
    """A profile applied to one topology's resources: the durations every policy and bound uses."""

    def __init__(self, profile: Profile, resources: Resources) -> None:
        self.profile = profile
        self.resources = resources
        self.modelled: dict[str, str] = {}  # "T10 x2 sd sample" -> how it was derived
        self._sampler: dict[tuple[str, int, str], SamplerTimes] = {}
        self._transfer: dict[tuple[str, int, str, float], float] = {}
        self._decoder: dict[tuple[str, int, str], tuple[float, float]] = {}
        self._routes: dict[tuple[str, int, str], tuple[SamplerTimes, list[tuple[str, str, float, float]]]] = {}

    # ------------------------------------------------------------------ durations
    def sampler_times(self, clip: ClipLike, pool: SamplerPool, measured: Measured | None = None) -> SamplerTimes:
        key = (clip.spec, clip.frames, pool.name)
        if not measured and key in self._sampler:
            return self._sampler[key]
        p, spec = self.profile, clip.spec
        encoder = self.resources.pool(pool.encoder)
        why = f"pool {pool.name} ({pool.degree}×{pool.gpu_model}), spec {spec}"
        size = p.size_factor(spec, clip.frames)
        looked = p.sample(pool.gpu_model, pool.degree, spec, why)
        length = p.sample_time(pool.gpu_model, pool.degree, spec, clip.frames, why).seconds / looked.seconds
        if looked.modelled:
            self.modelled[f"{pool.gpu_model} ×{pool.degree} {spec} sample"] = (
                f"{looked.seconds:.1f} s: {looked.modelled}"
            )
        times = SamplerTimes(
            encode=_m(measured, encoder.name, "encode", spec, p.encode(encoder.gpu_model, spec, why)),
            offload=_m(measured, encoder.name, "offload", spec, p.offload(encoder.gpu_model, spec, why)),
            sample=_m(measured, pool.name, "sample", spec, looked.seconds) * length + p.data.orchestration.pool_gap_s,
            handoff=_m(measured, pool.name, "handoff", spec, p.handoff(spec, why)) * size,
        )
        if not measured:
            self._sampler[key] = times
        return times

    def transfer_time(self, clip: ClipLike, link: Link, measured: Measured | None = None) -> float:
        key = (clip.spec, clip.frames, link.name, link.gbit_s)
        if not measured and key in self._transfer:
            return self._transfer[key]
        p = self.profile
        seconds = p.transfer(clip.spec, clip.frames, link.gbit_s)
        if measured and (link.name, "transfer", clip.spec) in measured:  # measured for a reference-length clip
            seconds = measured[(link.name, "transfer", clip.spec)] * p.size_factor(clip.spec, clip.frames)
        if not measured:
            self._transfer[key] = seconds
        return seconds

    def decoder_times(self, clip: ClipLike, decoder: Decoder, measured: Measured | None = None) -> tuple[float, float]:
        """(decode, mux) seconds on ``decoder``."""
        key = (clip.spec, clip.frames, decoder.name)
        if not measured and key in self._decoder:
            return self._decoder[key]
        p, spec = self.profile, clip.spec
        why = f"decoder {decoder.label}, spec {spec}"
        scale = p.length_factor(clip.frames)
        times = (
            _m(measured, decoder.name, "decode", spec, p.decode(decoder.gpu_model, spec, why)) * scale
            + p.data.orchestration.decode_latency_s,
            _m(measured, decoder.name, "mux", spec, p.mux(decoder.gpu_model, spec, why)) * scale,
        )
        if not measured:
            self._decoder[key] = times
        return times

    def routes(
        self, clip: ClipLike, pool: SamplerPool, measured: Measured | None = None
    ) -> tuple[SamplerTimes, list[tuple[str, str, float, float]]]:
        """The clip's sampler times on ``pool`` and, per decoder, (decoder, link, transfer, decode + mux)."""
        key = (clip.spec, clip.frames, pool.name)
        if not measured and key in self._routes:
            return self._routes[key]
        out = (
            self.sampler_times(clip, pool, measured),
            [
                (
                    dec.name,
                    link.name,
                    self.transfer_time(clip, link, measured),
                    sum(self.decoder_times(clip, dec, measured)),
                )
                for dec, link in self.resources.routes(pool)
            ],
        )
        if not measured:
            self._routes[key] = out
        return out

    def check(self, clips: Sequence[ClipLike]) -> None:
        """Look every needed duration up once, so a missing profile entry fails before simulating."""
        kinds = {(c.spec, c.frames): c for c in clips}
        for clip in kinds.values():
            for pool in self.resources.samplers:
                self.sampler_times(clip, pool)
            for link in self.resources.links:
                self.transfer_time(clip, link)
            for decoder in self.resources.decoders:
                self.decoder_times(clip, decoder)


def _m(measured: Measured | None, resource: str, stage: str, spec: str, default: float) -> float:
    if measured:
        return measured.get((resource, stage, spec), default)
    return default
