"""Ulysses sequence parallelism: degree N processes (gloo on CPU) give degree 1's latent."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from h3flow.core.specs import Spec, get_spec, latent_frames
from h3flow.engines.local import sample_to_file
from h3flow.handoff.format import load_latent
from h3flow.reference.conditioning import encode_conditioning, save_conditioning
from h3flow.reference.sampler import TOKEN_PATCH

IMAGE = Path(__file__).resolve().parents[1] / "examples" / "images" / "checker-sun.png"
# 96 x 160 px -> a 6 x 10 latent -> 15 tokens a frame, 555 in all: not a multiple of 2 or
# 4, so the shards are padded and the padding must not leak into attention.
ODD = Spec("odd", height=96, width=160)


def sample(tmp_path: Path, spec: Spec, degree: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, str]]:
    cond_path = tmp_path / f"{spec.name}.cond"
    sha = save_conditioning(cond_path, encode_conditioning("slow pan right, zoom in", IMAGE, spec, 124))
    out = tmp_path / f"{spec.name}-{degree}.h3latent"
    meta = {"clip_id": "u", "frames": "124", "ulysses_degree": str(degree)}
    ref = sample_to_file(cond_path, sha, out, meta, seed=11, steps=6, frames=124, degree=degree)
    latent = load_latent(out, ref.sha256)
    assert latent.audio is not None
    return latent.video, latent.audio, latent.meta


@pytest.mark.parametrize(
    ("spec", "degree"), [(get_spec("tiny"), 2), (get_spec("tiny"), 4), (ODD, 2)], ids=["tiny-2", "tiny-4", "odd-2"]
)
def test_degree_n_matches_degree_one(tmp_path: Path, spec: Spec, degree: int) -> None:
    video1, audio1, _ = sample(tmp_path, spec, 1)
    video_n, audio_n, meta = sample(tmp_path, spec, degree)
    assert video_n.shape == (1, 24, latent_frames(124), spec.height // 16, spec.width // 16)
    assert meta["ulysses_degree"] == str(degree)
    assert float((video_n - video1).abs().max()) <= 1e-4
    assert torch.equal(audio_n, audio1)
    if spec is ODD:
        tokens = latent_frames(124) * (spec.height // 16 // TOKEN_PATCH) * (spec.width // 16 // TOKEN_PATCH)
        assert tokens % degree != 0
