"""The stage-time profile: how long each stage of one clip takes on each kind of GPU.

The operator edits a TOML file (default: ``h3flow/data/profile-default.toml``, whose
comments derive every number from the design's measurements). Times are for a clip of
``clip_seconds`` seconds; longer or shorter clips scale with their latent frame count.

Sampling times for Ulysses degrees that the file does not list come from Amdahl's law,
``S(d) = S1 * (f + (1 - f) / d)``: the serial fraction ``f`` is fitted from two listed
degrees of the same GPU model (any spec), else taken from ``[scaling] serial_fraction``.

Clip length: sampling follows a cost model in latent tokens N (latent frames x H/16 x
W/16, i.e. frames and pixels), ``S(N) = F + L*N + A*N^2`` per GPU model: A is
attention's superlinear term (full attention over all tokens), F a fixed per-clip cost.
Both are fitted from the GPU's two listed resolutions: a time ratio above the token
ratio is read as attention (F = 0), one below it as a fixed cost (A = 0); a GPU with one
listed resolution takes ``[scaling] attention_share``. Latent sizes (handoff, transfer)
are exact, from H3's latent layout; decode and mux scale with the latent frames.
Every looked-up number says whether it was listed or modelled, so reports can flag
conclusions that rest on modelled points.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from h3flow.core.errors import ConfigError
from h3flow.core.jsonio import format_validation_error
from h3flow.core.paths import DATA_DIR
from h3flow.core.specs import frames_for_seconds, get_spec, latent_frames

DEFAULT_PROFILE = DATA_DIR / "profile-default.toml"

Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
PerSpec = dict[str, Seconds]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuTimes(_Strict):
    """Stage times on one GPU model: per spec; sampling also per Ulysses degree."""

    encode: PerSpec = Field(default_factory=dict)
    offload: PerSpec = Field(default_factory=dict)
    sample: dict[str, dict[Annotated[int, Field(ge=1, le=64)], Seconds]] = Field(default_factory=dict)
    decode: PerSpec = Field(default_factory=dict)
    mux: PerSpec = Field(default_factory=dict)


class Scaling(_Strict):
    model: Literal["amdahl", "power"] = Field(
        "amdahl",
        description="unlisted Ulysses degrees: Amdahl's law S1 (f + (1 - f) / d), or a power law S(d) = a d^-b; "
        "each fitted through two listed degrees",
    )
    serial_fraction: Annotated[float, Field(ge=0, le=1)] = 0.2
    attention_share: Annotated[float, Field(ge=0, le=1)] = Field(
        0.05, description="attention's share of a reference clip's sampling, for a GPU with one listed resolution"
    )


class Transfer(_Strict):
    overhead_s: Seconds = Field(description="per-latent fixed cost: connect, hash on both ends, fsync")


class Orchestration(_Strict):
    """What running a clip through Prefect adds to its device work (``h3flow calibrate``
    measures it from runs; 0 where not measured). The planner adds ``pool_gap_s`` to each
    clip's sampling and ``decode_latency_s`` to each decode; ``first_start_s`` is a run's
    start-up before its first encode (:meth:`Profile.start_up`)."""

    pool_gap_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        0.0, description="a sampler pool's idle time between two clips when the next one is already waiting"
    )
    decode_latency_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        0.0, description="a latent verified on an idle decoder's host -> its decode starts"
    )
    first_start_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        0.0, description="a batch submitted -> its first encode starts"
    )


class Alternative(_Strict):
    """Another fit of the same measurements: profile entries (dotted, as in ``fitted``) set to other values."""

    why: str
    set: dict[str, float | str] = Field(min_length=1)


class ProfileFile(_Strict):
    version: Literal[1] = 1
    clip_seconds: Seconds = 5.0
    scaling: Scaling = Scaling()
    bytes_per_value: Annotated[int, Field(ge=1, le=8)] = Field(4, description="latent element size (fp32)")
    fitted: list[str] = Field(
        default_factory=list, description="entries solved to meet a target (the design's table), not measured"
    )
    modelled: dict[str, str] = Field(
        default_factory=dict,
        description="entries derived by a model, not measured: entry -> how (the plan flags them where they matter)",
    )
    alternatives: dict[str, Alternative] = Field(
        default_factory=dict,
        description="other fits that meet the same measurements as well: the plan says what each would recommend",
    )
    handoff: PerSpec
    transfer: Transfer
    orchestration: Orchestration = Orchestration()
    gpu: dict[str, GpuTimes]


@dataclass(frozen=True)
class Lookup:
    """A stage time and where it came from."""

    seconds: float
    modelled: str | None = None  # None when listed in the profile, else how it was derived


class Profile:
    """Stage-time lookups over a validated profile file."""

    def __init__(self, data: ProfileFile, source: str = "profile") -> None:
        self.data = data
        self.source = source
        self._ref_latent = latent_frames(frames_for_seconds(data.clip_seconds))

    # ------------------------------------------------------------------ helpers
    def _missing(self, key: str, why: str) -> ConfigError:
        return ConfigError(f"{self.source}: no entry {key} (needed for {why}); add it to the profile")

    def _gpu(self, model: str, why: str) -> GpuTimes:
        try:
            return self.data.gpu[model]
        except KeyError:
            raise self._missing(f"gpu.{_key(model)}", why) from None

    def _per_spec(self, model: str, stage: str, spec: str, why: str) -> float:
        table: dict[str, float] = getattr(self._gpu(model, why), stage)
        if spec not in table:
            raise self._missing(f"gpu.{_key(model)}.{stage}.{spec}", why)
        return table[spec]

    def length_factor(self, frames: int) -> float:
        """How much longer than the profile's reference clip a clip of ``frames`` is (latent frames)."""
        return latent_frames(frames) / self._ref_latent

    @property
    def reference_frames(self) -> int:
        return frames_for_seconds(self.data.clip_seconds)

    def latent_bytes(self, spec: str, frames: int) -> int:
        """The exact size of a latent file's tensors (H3's video + audio latents)."""
        layout = get_spec(spec)
        return self.data.bytes_per_value * (
            math.prod(layout.video_shape(frames)) + math.prod(layout.audio_shape(frames))
        )

    def size_factor(self, spec: str, frames: int) -> float:
        """A latent of ``frames`` against one of the reference length (same spec), by bytes."""
        return self.latent_bytes(spec, frames) / self.latent_bytes(spec, self.reference_frames)

    def encode(self, model: str, spec: str, why: str) -> float:
        return self._per_spec(model, "encode", spec, why)

    def offload(self, model: str, spec: str, why: str) -> float:
        return self._per_spec(model, "offload", spec, why)

    def decode(self, model: str, spec: str, why: str) -> float:
        return self._per_spec(model, "decode", spec, why)

    def mux(self, model: str, spec: str, why: str) -> float:
        return self._per_spec(model, "mux", spec, why)

    @property
    def start_up(self) -> float:
        """Seconds from submitting a batch to its first encode (measured runs; 0 if never measured)."""
        return self.data.orchestration.first_start_s

    def handoff(self, spec: str, why: str) -> float:
        if spec not in self.data.handoff:
            raise self._missing(f"handoff.{spec}", why)
        return self.data.handoff[spec]

    def transfer(self, spec: str, frames: int, gbit_s: float) -> float:
        """Fixed overhead plus the latent's exact bytes over the link's bandwidth."""
        return self.data.transfer.overhead_s + self.latent_bytes(spec, frames) * 8 / (gbit_s * 1e9)

    def serial_fraction(self, model: str) -> tuple[float, str]:
        """Amdahl's serial fraction for a GPU model: fitted from two listed degrees, else the default."""
        for spec, points in sorted(self._gpu(model, "scaling").sample.items()):
            if len(points) >= 2:
                (d1, s1), (d2, s2) = sorted(points.items())[:2]
                # s1 = T1 (f + (1-f)/d1), s2 = T1 (f + (1-f)/d2) -> f
                r = s1 / s2
                f = (1 / d1 - r / d2) / ((r - 1) + (1 / d1 - r / d2))
                if 0 <= f <= 1:
                    return f, f"serial fraction {f:.3f} fitted from {model} {spec} degrees {d1} and {d2}"
        f = self.data.scaling.serial_fraction
        return f, f"default serial fraction {f:.3f}"

    def sample(self, model: str, degree: int, spec: str, why: str) -> Lookup:
        points = self._gpu(model, why).sample.get(spec)
        if not points:
            raise self._missing(f"gpu.{_key(model)}.sample.{spec}", why)
        if degree in points:
            return Lookup(points[degree])
        near = min(points, key=lambda d: (abs(math.log(d / degree)), d))
        if self.data.scaling.model == "power":
            b, how = self.power_exponent(model)
            return Lookup(points[near] * (near / degree) ** b, f"power law from degree {near} ({how})")
        f, how = self.serial_fraction(model)
        amdahl = (f + (1 - f) / degree) / (f + (1 - f) / near)
        return Lookup(points[near] * amdahl, f"Amdahl from degree {near} ({how})")

    def power_exponent(self, model: str) -> tuple[float, str]:
        """The power law's exponent b (S(d) ~ d^-b) through two listed degrees, else the one Amdahl's default gives
        from degree 4 to 8."""
        for spec, points in sorted(self._gpu(model, "scaling").sample.items()):
            if len(points) >= 2:
                (d1, s1), (d2, s2) = sorted(points.items())[:2]
                b = math.log(s1 / s2) / math.log(d2 / d1)
                return b, f"exponent {b:.3f} fitted from {model} {spec} degrees {d1} and {d2}"
        f = self.data.scaling.serial_fraction
        b = math.log((f + (1 - f) / 4) / (f + (1 - f) / 8)) / math.log(2)
        return b, f"exponent {b:.3f} from the default serial fraction {f:.3f}"

    # ------------------------------------------------------------------ modelled entries and other fits
    def variant(self, name: str) -> Profile:
        """This profile under the alternative fit ``name`` (its entries replaced)."""
        return self.with_entries(self.data.alternatives[name].set, f"{self.source} [{name}]")

    def with_entries(self, entries: dict[str, float | str], source: str) -> Profile:
        """This profile with ``entries`` (dotted names, as in ``fitted``) set to other values."""
        raw = self.data.model_dump(mode="json")
        for entry, value in entries.items():
            *path, last = entry.split(".")
            table = raw
            for part in path:
                table = table.setdefault(part, {})
            table[last] = value
        raw["alternatives"] = {}
        return parse_profile(raw, source)

    def entry(self, name: str) -> float | str | None:
        """The value of a dotted entry, or None where the profile has none."""
        node: object = self.data.model_dump(mode="json")
        for part in name.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node if isinstance(node, (int, float, str)) else None

    # ------------------------------------------------------------------ the sampling cost model
    def curve(self, model: str) -> Curve:
        """The GPU model's sampling cost in latent tokens, fitted from its two largest listed resolutions."""
        gpu = self._gpu(model, "the sampling cost model")
        by_degree: dict[int, dict[str, float]] = {}
        for spec, points in gpu.sample.items():
            for degree, seconds in points.items():
                by_degree.setdefault(degree, {})[spec] = seconds
        if not by_degree:
            raise self._missing(f"gpu.{_key(model)}.sample", "the sampling cost model")
        degree = max(by_degree, key=lambda d: (len(by_degree[d]), -abs(math.log(d / 4))))
        known = sorted((tokens(spec, self.reference_frames), seconds) for spec, seconds in by_degree[degree].items())
        if len(known) < 2:
            (n1, s1), a = known[0], self.data.scaling.attention_share
            return Curve(0.0, s1 * (1 - a) / n1, s1 * a / n1**2, f"attention share {a:g} (default)")
        (n1, s1), (n2, s2) = known[-2], known[-1]
        r, ratio = n2 / n1, s2 / s1
        if ratio > r * r:
            raise ConfigError(
                f"{self.source}: gpu.{_key(model)}.sample: {ratio:.2f}x the time for {r:.2f}x the latent tokens "
                f"grows faster than attention's square: not a plausible profile"
            )
        if ratio >= r:  # superlinear: attention
            quad = (s2 - s1 * r) / (n2 * n2 - n1 * n1 * r)
            lin = (s1 - quad * n1 * n1) / n1
            return Curve(0.0, lin, quad, f"attention {quad * n1 * n1 / s1:.1%} of the smaller clip")
        if ratio <= 1:
            raise ConfigError(
                f"{self.source}: gpu.{_key(model)}.sample: a larger resolution samples no slower than a smaller one"
            )
        lin = (s2 - s1) / (n2 - n1)
        return Curve(s1 - lin * n1, lin, 0.0, f"fixed per-clip cost {(s1 - lin * n1) / s1:.1%} of the smaller clip")

    def sample_time(self, model: str, degree: int, spec: str, frames: int, why: str) -> Lookup:
        """Sampling one clip of ``frames`` at ``spec`` on ``degree`` GPUs of ``model``."""
        at_reference = self.sample(model, degree, spec, why)
        if frames == self.reference_frames:
            return at_reference
        curve = self.curve(model)
        scale = curve(tokens(spec, frames)) / curve(tokens(spec, self.reference_frames))
        return Lookup(at_reference.seconds * scale, at_reference.modelled)


@dataclass(frozen=True)
class Curve:
    """Seconds to sample N latent tokens: fixed + linear + attention (quadratic)."""

    fixed: float
    linear: float
    quadratic: float
    how: str

    def __call__(self, n: float) -> float:
        return self.fixed + self.linear * n + self.quadratic * n * n


def tokens(spec: str, frames: int) -> int:
    """Latent tokens the DiT attends over: latent frames x (H/16) x (W/16)."""
    _, _, t, h, w = get_spec(spec).video_shape(frames)
    return t * h * w


def _key(name: str) -> str:
    return name if all(c.isalnum() or c in "-_" for c in name) else f'"{name}"'


def parse_profile(raw: object, source: str = "profile") -> Profile:
    try:
        data = ProfileFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc)) from None
    return Profile(data, source)


def load_profile(path: Path | None = None) -> Profile:
    """Read and validate a profile TOML file (the shipped default when ``path`` is None)."""
    path = Path(path) if path is not None else DEFAULT_PROFILE
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such profile file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    return parse_profile(raw, str(path))
