"""Tiny MiniMax H3 checkpoints made from upstream ComfyUI's own classes, random weights.

Run with the test ComfyUI's Python (never h3flow's), its tree first on ``sys.path``:

    python tiny_h3_build.py COMFYUI_TREE OUT_DIR CONFIG_JSON

It writes into OUT_DIR (the caller, tests/tiny_h3.py, makes it atomic and caches it):

- ``dit.safetensors``: ``comfy.ldm.minimax.model.MiniMaxH3Model`` built with the small
  config CONFIG_JSON names, in curve form (``adaln_t_table``, as the Turing patch's lerp
  needs), saved with the model's own key layout (``state_dict()``), so ComfyUI's
  ``model_detection`` derives the config back from the shapes;
- ``lora.safetensors``: a rank-4 LoRA on every attention and MLP projection of that DiT,
  in ComfyUI's generic ``diffusion_model.<layer>.lora_up/lora_down/alpha`` format
  (what ``LoraLoaderModelOnly`` maps for any model);
- ``video_vae.safetensors``: ``comfy.ldm.minimax.vae.MiniMaxH3VideoVAE`` at its fixed
  size (2.6 B parameters) with its decoder's transformer linears in ComfyUI's int8
  ConvRot layout (``comfy_quant`` + per-row ``weight_scale``: the layout of the
  production ``*_int8_convrot`` file; in fp32 it would take 10 GB), the rest fp16;
- ``audio_vae.safetensors``: ``comfy.ldm.minimax.audio_vae.MiniMaxH3AudioVAE`` (fixed
  size, 151 M parameters), built for real so its resampling filters are upstream's;
- ``report.json``: what ``comfy.model_detection`` makes of the DiT, parameter counts.

Weights are seeded random draws scaled by 1/sqrt(fan-in), norms 1, layer scales small,
latent normalisation upstream's (video) or identity (audio): the outputs are finite and
deterministic, not meaningful. Third-party code is only imported, never copied.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TREE, OUT, CONFIG = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
sys.path.insert(0, str(TREE))
sys.argv = [sys.argv[0], "--cpu"]  # comfy.model_management reads its arguments at import

import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()

import comfy.model_detection  # noqa: E402
import comfy.ops  # noqa: E402
import torch  # noqa: E402
from comfy.ldm.minimax import vae as video_vae_module  # noqa: E402
from comfy.ldm.minimax.audio_vae import MiniMaxH3AudioVAE  # noqa: E402
from comfy.ldm.minimax.model import MiniMaxH3Model  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

SEED = 20260822
LORA_RANK = 4
CONVROT = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}
generator = torch.Generator().manual_seed(SEED)


def draw(shape: torch.Size | tuple[int, ...], scale: float) -> torch.Tensor:
    return torch.randn(tuple(shape), generator=generator) * scale


def fan_in(shape: torch.Size) -> int:
    n = 1
    for d in shape[1:]:
        n *= d
    return max(n, 1)


def random_like(name: str, t: torch.Tensor) -> torch.Tensor:
    """A seeded random value for one parameter, by what it is (norm weight, bias, layer scale, weight)."""
    last = name.rsplit(".", 1)[-1]
    if "norm" in name and last == "weight":
        return torch.ones(t.shape)
    if last in ("bias", "q_bias", "v_bias") or t.ndim == 1:
        return draw(t.shape, 0.02)
    if last in ("scale1", "scale2"):  # the video decoder's layer scales: small keeps 36 random blocks finite
        return torch.full(t.shape, 0.05)
    return draw(t.shape, fan_in(t.shape) ** -0.5)


def build_dit() -> dict[str, object]:
    with torch.device("meta"):
        model = MiniMaxH3Model(**CONFIG, operations=comfy.ops.disable_weight_init)
    sd: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if name == "rope.inv_freq":
            n = t.shape[0]
            sd[name] = 1.0 / 10000.0 ** (torch.arange(n, dtype=torch.float32) / n)
        elif name == "adaln_t_table":
            sd[name] = draw(t.shape, 1.0)
        else:
            sd[name] = random_like(name, t)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(OUT / "dit.safetensors"))
    lora: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        if name.endswith(".weight") and t.ndim == 2 and (".attn." in name or ".mlp." in name):
            base = "diffusion_model." + name[: -len(".weight")]
            lora[f"{base}.lora_down.weight"] = draw((LORA_RANK, t.shape[1]), t.shape[1] ** -0.5)
            lora[f"{base}.lora_up.weight"] = draw((t.shape[0], LORA_RANK), 0.5)
            lora[f"{base}.alpha"] = torch.tensor(float(LORA_RANK))
    save_file(lora, str(OUT / "lora.safetensors"))
    detected = comfy.model_detection.detect_unet_config(sd, "")
    return {
        "dit_detected": {k: list(v) if isinstance(v, tuple) else v for k, v in (detected or {}).items()},
        "dit_parameters": sum(v.numel() for v in sd.values()),
        "lora_layers": len(lora) // 3,
    }


def build_video_vae() -> dict[str, object]:
    with torch.device("meta"):
        model = video_vae_module.MiniMaxH3VideoVAE(operations=comfy.ops.disable_weight_init)
    sd: dict[str, torch.Tensor] = {}
    quantized = 0
    quant_conf = torch.tensor(list(json.dumps(CONVROT).encode("utf-8")), dtype=torch.uint8)
    for name, t in model.state_dict().items():
        if name in ("latents_mean", "latents_std"):
            sd[name] = torch.tensor(getattr(video_vae_module, name.upper()), dtype=torch.float32)
        elif name == "decoder.mask_token":  # unused at inference
            sd[name] = torch.zeros(t.shape)
        elif name.startswith("decoder.transformer_blocks.") and name.endswith(".weight") and t.ndim == 2:
            # int8 ConvRot: int8 [out, in] and a per-row fp32 scale, as comfy_kitchen's quantizer lays it out
            prefix = name[: -len("weight")]
            sd[name] = torch.randint(-127, 128, tuple(t.shape), dtype=torch.int8, generator=generator)
            sd[prefix + "weight_scale"] = torch.full((t.shape[0], 1), 2.0 / 127 / t.shape[1] ** 0.5)
            sd[prefix + "comfy_quant"] = quant_conf.clone()
            quantized += 1
        else:
            value = random_like(name, t)
            sd[name] = value.to(torch.float16) if value.numel() > 4096 else value
    save_file(sd, str(OUT / "video_vae.safetensors"))
    return {
        "video_vae_parameters": sum(t.numel() for t in model.state_dict().values()),
        "video_vae_int8_layers": quantized,
    }


def build_audio_vae() -> dict[str, object]:
    model = MiniMaxH3AudioVAE()  # built for real (600 MB): its filter buffers are computed, not random
    params = dict(model.named_parameters())
    sd: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        last = name.rsplit(".", 1)[-1]
        if name == "latents_mean" or name.endswith("zero_k_bias"):
            sd[name] = torch.zeros(t.shape)
        elif name == "latents_std":
            sd[name] = torch.ones(t.shape)
        elif name not in params:
            sd[name] = t.detach().clone()  # upstream's own filters
        elif last in ("alpha", "beta") and t.ndim == 1:  # SnakeBeta, log scale: exp(0) = 1
            sd[name] = torch.zeros(t.shape)
        elif last == "alpha":  # Snake1d
            sd[name] = torch.ones(t.shape)
        else:
            sd[name] = random_like(name, t)
    save_file(sd, str(OUT / "audio_vae.safetensors"))
    return {"audio_vae_parameters": sum(v.numel() for v in params.values())}


if __name__ == "__main__":
    report = {**build_dit(), **build_video_vae(), **build_audio_vae()}
    (OUT / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(json.dumps(report, sort_keys=True))
