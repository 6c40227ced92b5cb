"""Tiny MiniMax H3 weights for the tests, made at test time from upstream's classes and cached.

:func:`tiny_h3` runs ``tiny_h3_build.py`` with the test ComfyUI's own Python (the classes
live in its tree, never in this repository) and keeps the result in
``${H3FLOW_CACHE:-~/.cache/h3flow}/tiny-h3/<key>``, where the key hashes everything
the bytes depend on: the builder, the config, the upstream model sources, torch's
version. A second run, or a second test module, finds it there: made once, never
downloaded. :func:`install_models` links the files into a ComfyUI base directory under
the names :data:`NAMES` gives, which the templates receive as parameters.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from h3flow.core.fsutil import file_lock
from h3flow.ops.comfy_install import ComfyInstall, cache_dir

BUILDER = Path(__file__).with_name("tiny_h3_build.py")

# The DiT: 2 blocks of width 128, one head of dim 128 (the rotary table expects 128 with
# 16 inverse frequencies), a 1-block token refiner, text dim 48, curve-form adaLN.
DIT_CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "num_layers": 2,
    "token_refiner_num_layers": 1,
    "num_attention_heads": 1,
    "attention_head_dim": 128,
    "ffn_hidden_size": 256,
    "text_dim": 48,
    "time_embed_dim": 64,
    "adaln_curve_grid": 33,
}
TEXT_DIM = DIT_CONFIG["text_dim"]

# file in the cache -> (ComfyUI models/ folder, the name the templates are given)
NAMES = {
    "dit.safetensors": ("diffusion_models", "h3flow_tiny_minimax_h3_dit.safetensors"),
    "lora.safetensors": ("loras", "h3flow_tiny_minimax_h3_lora.safetensors"),
    "video_vae.safetensors": ("vae", "h3flow_tiny_minimax_h3_video_vae_int8_convrot.safetensors"),
    "audio_vae.safetensors": ("vae", "h3flow_tiny_minimax_h3_audio_vae.safetensors"),
}
UPSTREAM_SOURCES = ("comfy/ldm/minimax/model.py", "comfy/ldm/minimax/vae.py", "comfy/ldm/minimax/audio_vae.py")


@dataclass(frozen=True)
class TinyH3:
    """The cached tiny checkpoints, what upstream's detection made of them, and how long making them took."""

    folder: Path
    report: dict[str, Any]
    build_seconds: float | None  # None: found in the cache

    def path(self, name: str) -> Path:
        return self.folder / name

    @property
    def params(self) -> dict[str, str]:
        """The production templates' model parameters, pointing at the tiny files."""
        return {
            "unet_name": NAMES["dit.safetensors"][1],
            "lora_name": NAMES["lora.safetensors"][1],
            "vae_name": NAMES["video_vae.safetensors"][1],
            "audio_vae_name": NAMES["audio_vae.safetensors"][1],
        }


def cache_key(install: ComfyInstall) -> str:
    digest = hashlib.sha256(BUILDER.read_bytes())
    digest.update(json.dumps(DIT_CONFIG, sort_keys=True).encode())
    for rel in UPSTREAM_SOURCES:
        digest.update((install.tree / rel).read_bytes())
    torch_version = subprocess.run(
        [str(install.python), "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    digest.update(torch_version.encode())
    return digest.hexdigest()[:16]


def tiny_h3(install: ComfyInstall) -> TinyH3:
    """The tiny checkpoints for this ComfyUI, built once (about a minute, 3 GB on disk) and cached."""
    folder = cache_dir() / "tiny-h3" / cache_key(install)
    done = folder / "report.json"
    if done.is_file():
        return TinyH3(folder, json.loads(done.read_text()), None)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(folder.parent / f".{folder.name}.lock"):
        if done.is_file():
            return TinyH3(folder, json.loads(done.read_text()), None)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            started = time.monotonic()
            proc = subprocess.run(
                [str(install.python), str(BUILDER), str(install.tree), str(staging), json.dumps(DIT_CONFIG)],
                capture_output=True,
                text=True,
                env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"},
                timeout=1800,
            )
            if proc.returncode != 0:
                tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-12:])
                raise RuntimeError(f"tiny H3 build failed: {tail}")
            seconds = time.monotonic() - started
            shutil.rmtree(folder, ignore_errors=True)
            staging.rename(folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return TinyH3(folder, json.loads(done.read_text()), seconds)


def install_models(tiny: TinyH3, base_dir: Path) -> None:
    """Link the tiny files into a ComfyUI base directory's ``models/`` under the templates' names."""
    for cached, (kind, name) in NAMES.items():
        target = base_dir / "models" / kind / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        target.symlink_to(tiny.path(cached))
