"""The local engine end to end: encode -> offload -> sample (.h3latent) -> decode (MP4), checked with PyAV."""

from __future__ import annotations

from pathlib import Path

import av
import pytest
import torch

from h3flow.core.batch import Clip
from h3flow.core.errors import ConfigError, H3FlowError, IntegrityError
from h3flow.core.files import FileRef
from h3flow.core.fsutil import sha256_file
from h3flow.engines.base import Engine
from h3flow.engines.local import LocalEngine, decode_latent_to_mp4, frames_of
from h3flow.handoff.format import H3Latent, load_latent
from h3flow.media.mux import probe_mp4
from h3flow.reference.conditioning import load_reference_image
from h3flow.reference.vae import psnr

IMAGES = Path(__file__).resolve().parents[1] / "examples" / "images"
# First frame of the MP4 against the reference image resized to the spec, worst of the
# example images (checker-sun): measured 22.7 dB tiny, 31.7 dB SD, 39.0 dB HD after the
# 24-channel VAE + x264 (crf 18, yuv420p). A different image scores < 12 dB.
FIRST_FRAME_BOUND_DB = {"tiny": 21.0, "sd": 30.0, "hd": 37.0}


def clip(
    spec: str = "tiny", image: str = "checker-sun.png", seed: int = 5, prompt: str = "slow pan left, calm"
) -> Clip:
    return Clip(id=f"c-{spec}", prompt=prompt, image=IMAGES / image, spec=spec, seconds=5, seed=seed)


def run(engine: LocalEngine, c: Clip, work: Path) -> tuple[FileRef, FileRef, FileRef]:
    cond = engine.encode(c, work / f"{c.id}.cond")
    engine.offload()
    latent = engine.sample(c, cond, work / f"{c.id}.h3latent")
    video = engine.decode(latent, work / f"{c.id}.mp4")
    return cond, latent, video


def first_frame(path: Path) -> torch.Tensor:
    with av.open(str(path)) as container:
        return torch.from_numpy(next(container.decode(video=0)).to_ndarray(format="rgb24"))


def check_mp4(path: Path, c: Clip) -> None:
    spec = c.resolved_spec
    info = probe_mp4(path)
    assert (info.video_codec, info.pix_fmt, info.width, info.height) == ("h264", "yuv420p", spec.width, spec.height)
    assert (info.audio_codec, info.sample_rate, info.channels) == ("aac", 48_000, 2)
    assert info.frames == c.frames == 124 and info.fps == 24
    assert abs(info.video_seconds - 124 / 24) < 1 / 24 and abs(info.audio_seconds - 124 / 24) < 1 / 24
    assert info.audio_rms > 0.02 and info.audio_peak < 1.0  # not silent, not clipped
    assert info.faststart
    ref = (load_reference_image(c.image, spec.height, spec.width) * 255).round()
    other = (load_reference_image(IMAGES / "shapes.png", spec.height, spec.width) * 255).round()
    frame = first_frame(path)
    assert psnr(frame, ref) >= FIRST_FRAME_BOUND_DB[c.spec] > psnr(frame, other) + 5


def test_tiny_clip_end_to_end(tmp_path: Path) -> None:
    engine: Engine = LocalEngine()
    c = clip()
    cond, latent, video = run(engine, c, tmp_path)  # type: ignore[arg-type]
    for ref in (cond, latent, video):
        assert ref.path.is_file() and ref.sha256 == sha256_file(ref.path) and ref.size == ref.path.stat().st_size
    loaded = load_latent(latent.path, latent.sha256)
    assert loaded.video.shape == (1, 24, 37, 8, 14) and loaded.video.dtype == torch.float32
    assert loaded.audio is not None and loaded.audio.shape == (1, 32, 2, 207)
    assert (
        loaded.meta["clip_id"] == c.id
        and loaded.meta["seed"] == "5"
        and loaded.meta["conditioning_sha256"] == cond.sha256
    )
    assert frames_of(loaded) == 124
    check_mp4(video.path, c)


def test_deterministic_in_inputs_and_seed_varies(tmp_path: Path) -> None:
    engine = LocalEngine()
    a = run(engine, clip(), tmp_path / "a")
    b = run(engine, clip(), tmp_path / "b")
    s = run(engine, clip(seed=6), tmp_path / "s")
    assert a[0].sha256 == b[0].sha256 == s[0].sha256  # conditioning does not depend on the seed
    la, lb, ls = (load_latent(x[1].path) for x in (a, b, s))
    assert torch.equal(la.video, lb.video) and torch.equal(la.audio, lb.audio)
    assert not torch.equal(la.video, ls.video)
    assert a[2].sha256 == b[2].sha256  # same latent tensors -> same MP4 bytes


def test_decode_refuses_a_tampered_latent_and_writes_nothing(tmp_path: Path) -> None:
    engine = LocalEngine()
    c = clip()
    cond = engine.encode(c, tmp_path / "c.cond")
    latent = engine.sample(c, cond, tmp_path / "l.h3latent")
    data = bytearray(latent.path.read_bytes())
    data[-5] ^= 0xFF  # one bit-flip in the audio tensor
    latent.path.write_bytes(bytes(data))
    out = tmp_path / "out.mp4"
    with pytest.raises(IntegrityError):
        engine.decode(latent, out)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["c.cond", "l.h3latent"]
    out.write_bytes(b"earlier video")
    with pytest.raises(IntegrityError):
        engine.decode(latent, out)
    assert out.read_bytes() == b"earlier video"


def test_sample_checks_the_conditioning(tmp_path: Path) -> None:
    engine = LocalEngine()
    cond = engine.encode(clip(), tmp_path / "c.cond")
    with pytest.raises(IntegrityError):
        engine.sample(clip(), FileRef(cond.path, "f" * 64, cond.size), tmp_path / "l.h3latent")
    with pytest.raises(H3FlowError, match="encoded for"):
        engine.sample(clip(spec="sd"), cond, tmp_path / "l.h3latent")
    assert not (tmp_path / "l.h3latent").exists()


def test_offload_keeps_or_drops_the_encoder(tmp_path: Path) -> None:
    keep = LocalEngine(retain_cpu_weights=True)
    keep.encode(clip(), tmp_path / "k.cond")
    report = keep.offload()
    assert (
        report.kept_cpu_copy and report.freed_bytes == 0 and report.free_per_device["cpu"] > 0
    )  # CPU copy is the copy
    drop = LocalEngine(retain_cpu_weights=False)
    first = drop.encode(clip(), tmp_path / "d1.cond")
    report = drop.offload()
    assert not report.kept_cpu_copy and report.freed_bytes == 24 * 768 * 4
    assert drop.offload().freed_bytes == 0
    assert drop.encode(clip(), tmp_path / "d2.cond").sha256 == first.sha256  # reloads and works


def test_bad_settings_and_latents_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="degree"):
        LocalEngine(degree=3)
    video = torch.zeros(2, 24, 37, 8, 14)
    with pytest.raises(H3FlowError, match="batch 1"):
        decode_latent_to_mp4(H3Latent(video, None, {"frames": "124"}), tmp_path / "x.mp4")
    with pytest.raises(H3FlowError, match="T=37"):
        decode_latent_to_mp4(H3Latent(video[:1], None, {"frames": "56"}), tmp_path / "x.mp4")
    assert not (tmp_path / "x.mp4").exists()


def test_fp32_decode_and_a_latent_without_audio(tmp_path: Path) -> None:
    """A plain ComfyUI latent (video only, no frame count) decodes with a silent track."""
    engine = LocalEngine(int8_decode=False)
    c = clip(image="landscape.png")
    _, latent, video = run(engine, c, tmp_path)
    int8 = LocalEngine().decode(latent, tmp_path / "int8.mp4")
    assert psnr(first_frame(video.path), first_frame(int8.path)) >= 40
    loaded = load_latent(latent.path)
    out = decode_latent_to_mp4(H3Latent(loaded.video, None, {}), tmp_path / "silent.mp4")
    info = probe_mp4(out.path)
    assert info.frames == 124 and info.audio_peak == 0.0


@pytest.mark.parametrize("spec", ["sd", "hd"])
def test_sd_and_hd_five_seconds(tmp_path: Path, spec: str) -> None:
    c = clip(spec=spec, prompt="zoom in on the sun, bright summer day")
    _, latent, video = run(LocalEngine(), c, tmp_path)
    assert load_latent(latent.path).video.shape == c.resolved_spec.video_shape(124)
    check_mp4(video.path, c)


def test_ulysses_degree_two_through_the_engine(tmp_path: Path) -> None:
    c = clip()
    one = run(LocalEngine(), c, tmp_path / "one")
    two = run(LocalEngine(degree=2), c, tmp_path / "two")
    l1, l2 = load_latent(one[1].path), load_latent(two[1].path)
    assert l2.meta["ulysses_degree"] == "2"
    assert float((l1.video - l2.video).abs().max()) <= 1e-4
