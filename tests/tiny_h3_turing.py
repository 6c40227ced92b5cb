"""One sampling run of the tiny H3 DiT in a given dtype set-up, for the Turing patch test.

Run with the test ComfyUI's Python: ``python tiny_h3_turing.py COMFYUI_TREE DIT_FILE SETUP``,
SETUP ``t10`` or ``fp32``. Prints JSON (the dtypes the model ended up with, the mean
absolute value of each sampled stream) or fails with upstream's own exception.

``t10`` is what ComfyUI does on a Tesla T10 (sm75, no native bf16): H3's weights stored
bf16 (``supported_inference_dtypes`` bf16/fp32, the model too big for fp32), compute in
fp32 (``unet_manual_cast``), and, because ComfyUI's default model patcher on NVIDIA is
DynamicVRAM, the weights loaded with ``assign=True`` (``comfy/sd.py``:
``load_model_weights(..., assign=model_patcher.is_dynamic())``), so buffers keep the
checkpoint's dtype. On CPU the patcher is not dynamic: the same ``load_model_weights``
call is made with ``assign=True`` after the ordinary load. The checkpoint is the tiny DiT
with its floating tensors in bf16, as a bf16 H3 checkpoint ships.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TREE, DIT, SETUP = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
sys.path.insert(0, str(TREE))
sys.argv = [sys.argv[0], "--cpu"]

import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()

import comfy.sd  # noqa: E402
import comfy.utils  # noqa: E402
import nodes  # noqa: E402
import torch  # noqa: E402
from comfy_extras.nodes_minimax_h3 import _empty_av_latent  # noqa: E402

sd = comfy.utils.load_torch_file(str(DIT))
if SETUP == "t10":
    sd = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in sd.items()}
    model = comfy.sd.load_diffusion_model_state_dict(dict(sd), model_options={"dtype": torch.bfloat16})
    model.model.load_model_weights(dict(sd), "", assign=True)  # what ModelPatcherDynamic's load does
elif SETUP == "fp32":
    model = comfy.sd.load_diffusion_model_state_dict(dict(sd), model_options={"dtype": torch.float32})
else:
    raise SystemExit(f"unknown set-up {SETUP!r} (t10 or fp32)")

dit = model.model.diffusion_model
generator = torch.Generator().manual_seed(11)
tags = torch.ones(12, dtype=torch.long)
tags[2:8] = 0
positive = [[torch.randn(1, 12, dit.condition_proj.weight.shape[1], generator=generator),
             {"pooled_output": None, "minimax_token_tags": tags}]]  # fmt: skip
negative = [[torch.zeros_like(positive[0][0]), {"pooled_output": None, "minimax_token_tags": tags}]]
latent, _ = _empty_av_latent(224, 128, 22)
out = nodes.common_ksampler(model, 3, 2, 1.0, "euler", "simple", positive, negative, latent)[0]["samples"]
print(
    json.dumps(
        {
            "dtypes": {
                "weights": str(dit.blocks[0].attn.qkv_proj.weight.dtype),
                "compute": str(model.model.manual_cast_dtype or model.model.get_dtype()),
                "adaln_t_table": str(dit.adaln_t_table.dtype),
            },
            "means": [float(t.float().abs().mean()) for t in out.tensors],
        }
    )
)
