"""Conditioning: prompt words -> camera path and audio, image -> first-frame latent, the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from h3flow.core.errors import H3FlowError, IntegrityError
from h3flow.core.fsutil import sha256_bytes, sha256_file
from h3flow.core.specs import get_spec
from h3flow.reference import conditioning as C
from h3flow.reference.vae import encode_images

IMAGE = Path(__file__).resolve().parents[1] / "examples" / "images" / "landscape.png"
P, Z = C.PAN_PER_SECOND, C.ZOOM_PER_SECOND


@pytest.mark.parametrize(
    ("prompt", "pan_x", "pan_y", "zoom"),
    [
        ("pan left over the lake", -P, 0.0, 0.0),
        ("Camera pans RIGHT, quickly!", 2 * P, 0.0, 0.0),
        ("slow tilt up to the sky", 0.0, -P / 2, 0.0),
        ("tilt downward", 0.0, P, 0.0),
        ("zoom in on the red ball", 0.0, 0.0, Z),
        ("the camera pulls back slowly", 0.0, 0.0, -Z / 2),
        ("fast push in while panning left", -2 * P, 0.0, 2 * Z),
        ("static shot of a lake, tripod", 0.0, 0.0, 0.0),
        ("a still shot of the sun", 0.0, 0.0, 0.0),
        ("pan left over a still lake", -P, 0.0, 0.0),
        ("a red ball on grass", 0.0, 0.0, Z / 2),  # no camera word: a slow push in
    ],
)
def test_camera_words(prompt: str, pan_x: float, pan_y: float, zoom: float) -> None:
    cam = C.parse_camera(prompt)
    assert (cam.pan_x, cam.pan_y, cam.zoom) == pytest.approx((pan_x, pan_y, zoom))


@pytest.mark.parametrize(
    ("prompt", "mood", "intervals"),
    [
        ("a happy sunny morning", "happy", (0, 4, 7, 12)),
        ("sad rain at night, slow pan left", "sad", (0, 3, 7, 12)),
        ("storm over the sea", "tense", (0, 3, 6, 9)),
        ("a cube", "neutral", (0, 7, 12)),
    ],
)
def test_mood_words_pick_the_chord(prompt: str, mood: str, intervals: tuple[int, ...]) -> None:
    audio = C.parse_audio(prompt)
    assert audio.mood == mood
    assert tuple(n - audio.notes[0] for n in audio.notes) == intervals
    weights = audio.notes_tensor()
    assert weights.shape == (32,) and set(torch.nonzero(weights).flatten().tolist()) == set(audio.notes)


def test_pan_sets_stereo_balance_and_speed_sets_pulse() -> None:
    assert C.parse_audio("slow pan left").balance < 0 < C.parse_audio("pan right").balance
    assert C.parse_audio("fast pan right").pulse_hz > C.parse_audio("slow pan right").pulse_hz


def test_reference_image_is_covered_and_centre_cropped(tmp_path: Path) -> None:
    wide = np.zeros((100, 400, 3), np.uint8)
    wide[:, :100] = (255, 0, 0)  # red left quarter is cut away by a 1:1 crop
    wide[:, 150:250] = (0, 0, 255)  # blue centre stays
    Image.fromarray(wide).save(tmp_path / "wide.png")
    out = C.load_reference_image(tmp_path / "wide.png", 64, 64)
    assert out.shape == (64, 64, 3) and out.dtype == torch.float32
    assert out[:, :, 0].max() < 0.05  # no red
    assert out[:, 32, 2].min() > 0.95  # blue in the middle


def test_encode_is_deterministic_and_holds_the_first_frame_latent(tmp_path: Path) -> None:
    spec = get_spec("tiny")
    cond = C.encode_conditioning("slow pan left over a calm lake", IMAGE, spec, 124)
    assert cond.first_frame.shape == (1, 24, 1, 8, 14) and cond.first_frame.dtype == torch.float32
    expected = encode_images(C.load_reference_image(IMAGE, 128, 224)[None])
    assert torch.equal(cond.first_frame[:, :, 0], expected)
    rgb = np.asarray(Image.open(IMAGE).convert("RGB"))  # the picture, not the file's bytes (LoadImage gives the same)
    assert cond.meta["image_pixels_sha256"] == C.pixels_sha256(rgb)
    assert C.pixels_sha256(rgb) == sha256_bytes(f"{rgb.shape[0]}x{rgb.shape[1]}x3:".encode() + rgb.tobytes())
    assert cond.meta["spec"] == "tiny" and cond.meta["frames"] == "124" and cond.meta["encoder"] == C.ENCODER_ID
    sha1 = C.save_conditioning(tmp_path / "a.cond", cond)
    sha2 = C.save_conditioning(
        tmp_path / "b.cond", C.encode_conditioning("slow pan left over a calm lake", IMAGE, spec, 124)
    )
    assert sha1 == sha2 == sha256_file(tmp_path / "a.cond")
    other = C.save_conditioning(tmp_path / "c.cond", C.encode_conditioning("slow pan right", IMAGE, spec, 124))
    assert other != sha1


def test_file_round_trip_and_integrity(tmp_path: Path) -> None:
    cond = C.encode_conditioning("zoom out", IMAGE, get_spec("tiny"), 39)
    path = tmp_path / "x.cond"
    sha = C.save_conditioning(path, cond)
    back = C.load_conditioning(path, sha)
    for name, tensor in cond.tensors().items():
        assert torch.equal(back.tensors()[name], tensor)
    assert back.meta == cond.meta
    with pytest.raises(IntegrityError):
        C.load_conditioning(path, "0" * 64)


def test_bad_files_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "junk.cond").write_bytes(b"\x00" * 40)
    with pytest.raises(H3FlowError, match="not a safetensors file"):
        C.load_conditioning(tmp_path / "junk.cond")
    save_file({"latent_tensor": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(H3FlowError, match="not an h3flow conditioning file"):
        C.load_conditioning(tmp_path / "other.safetensors")
    with pytest.raises(H3FlowError, match="no such file"):
        C.load_conditioning(tmp_path / "missing.cond")
    (tmp_path / "fake.png").write_text("not an image")
    with pytest.raises(H3FlowError, match="cannot read it as an image") as err:
        C.encode_conditioning("pan left", tmp_path / "fake.png", get_spec("tiny"), 124)
    assert "\n" not in str(err.value)
    with pytest.raises(H3FlowError, match="no such file"):
        C.encode_conditioning("pan left", tmp_path / "none.png", get_spec("tiny"), 124)
