"""The reference sampler's identity, torch-free: h3flow writes it into a latent's
provenance without importing torch (several seconds on the 2-core demo machine)."""

from __future__ import annotations

from dataclasses import dataclass

SAMPLER_ID = "euler-simple"


@dataclass(frozen=True)
class DenoiserConfig:
    heads: int = 8
    head_dim: int = 8
    gain: float = 0.01
    weight_seed: int = 0x4833  # "H3"
    shift: float = 1.0  # flow time shift of the sigma table (1.0: none)

    @property
    def model_id(self) -> str:
        return f"h3flow-reference-attn{self.heads}x{self.head_dim}-g{self.gain}-w{self.weight_seed}"
