"""Cache keys: each stage's key is a hash of the content it depends on, nothing else.

These are plain functions so the dispatcher, ``resume`` and the tests compute the same
keys the tasks use (ARCHITECTURE.md, "the data path").
"""

from __future__ import annotations

from h3flow.config.models import Model
from h3flow.core.batch import Clip
from h3flow.core.fsutil import sha256_file, sha256_json


def encode_key(clip: Clip, model: Model, image_sha256: str | None = None) -> str:
    """prompt + reference image bytes + encoder config (and the spec/frames the conditioning is sized for)."""
    return sha256_json(
        {
            "stage": "encode",
            "prompt": clip.prompt,
            "image": image_sha256 or clip.image_sha256 or sha256_file(clip.image),
            "encoder": [model.kind, model.text_encoder],
            "spec": clip.spec,
            "frames": clip.frames,
        }
    )


def sample_key(clip: Clip, model: Model, conditioning_sha256: str) -> str:
    """conditioning hash + seed + steps + sampler + model ids + spec."""
    return sha256_json(
        {
            "stage": "sample",
            "conditioning": conditioning_sha256,
            "seed": clip.seed,
            "steps": clip.steps,
            "sampler": [model.sampler, model.scheduler],
            "models": [model.kind, model.dit, model.lora],
            "spec": clip.spec,
            "frames": clip.frames,
        }
    )


def transfer_key(latent_sha256: str, target_host: str, store_root: str) -> str:
    return sha256_json({"stage": "transfer", "latent": latent_sha256, "to": [target_host, store_root]})


def decode_key(latent_sha256: str, model: Model) -> str:
    return sha256_json({"stage": "decode", "latent": latent_sha256, "vae": [model.kind, model.vae]})
