"""The node-schema transcription (h3flow/data/comfy_object_info_upstream.json) against the
real upstream sources in ../shared/upstream, read with ``ast`` (never imported).

Every upstream node the production templates use names the file and commit it was
transcribed from (``_about.nodes``); that file is parsed (V1 ``INPUT_TYPES`` or V3
``define_schema``) and every input, type, combo option, default, range, UI flag and
output must match. Skips, saying where it looked, when ../shared/upstream is absent.
"""

from __future__ import annotations

import copy
import json
import re
from functools import cache

import pytest
from upstream import read_upstream, require_upstream
from upstream_nodes import ModuleConstants, compare, node_schemas

from h3flow.core.paths import PACKAGE_DIR
from h3flow.engines.workflows import TEMPLATES, UPSTREAM_SCHEMA, load_template, upstream_object_info

FIXTURE = PACKAGE_DIR / "data" / UPSTREAM_SCHEMA
PACK_PREFIX = "H3"  # the h3flow pack's own nodes: checked against the pack (test_comfy_pack, test_comfy_server)
SOURCE = re.compile(r"^(?P<repo>\S+) (?P<path>\S+) @ (?P<commit>[0-9a-f]{40})$")
# modules whose constants upstream node sources use (nodes.MAX_RESOLUTION, yunchang's AttnType)
IMPORTED = {
    "nodes": ("Comfy-Org/ComfyUI", "nodes.py", "02217e36"),
    "yunchang.kernels": ("feifeibear/long-context-attention", "yunchang/kernels/__init__.py", "56118e0d"),
}
# inputs whose options only a running ComfyUI knows: host file lists, and sampler/scheduler
# names from comfy/samplers.py (not stored in ../shared/upstream, so not checked)
DYNAMIC = {
    "CLIPLoader.clip_name: folder_paths.get_filename_list('text_encoders')",
    "KSamplerAdvanced.sampler_name: comfy.samplers.KSampler.SAMPLERS",
    "KSamplerAdvanced.scheduler: comfy.samplers.KSampler.SCHEDULERS",
    "LoadImage.image: sorted(files)",
    "LoraLoaderModelOnly.lora_name: folder_paths.get_filename_list('loras')",
    "UNETLoader.unet_name: folder_paths.get_filename_list('diffusion_models')",
    "VAELoader.vae_name: s.vae_list(s)",
    "RayLoraLoader.lora_name: folder_paths.get_filename_list('loras')",
    "RayUNETLoader.unet_name: folder_paths.get_filename_list('diffusion_models') + folder_paths.get_filename_list('checkpoints')",
    "XFuserKSamplerAdvanced.sampler_name: comfy.samplers.KSampler.SAMPLERS",
    "XFuserKSamplerAdvanced.scheduler: comfy.samplers.KSampler.SCHEDULERS",
}


def transcription() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def sources() -> dict[str, tuple[str, str, str]]:
    """node -> (repo, path, commit) as the transcription records it."""
    out = {}
    for node, cited in transcription()["_about"]["nodes"].items():
        match = SOURCE.match(cited)
        assert match, f"{node}: source {cited!r} is not 'owner/repo path @ 40-hex commit'"
        out[node] = (match["repo"], match["path"], match["commit"])
    return out


@cache
def parsed(repo: str, path: str, commit: str) -> ModuleConstants:
    imports = {name: ModuleConstants(read_upstream(*where)) for name, where in IMPORTED.items() if where[1] != path}
    return ModuleConstants(read_upstream(repo, path, commit), imports)


def upstream_schema(node: str) -> dict:
    repo, path, commit = sources()[node]
    found = node_schemas(parsed(repo, path, commit), {node})
    assert node in found, f"{node} is not defined in {repo} {path} @ {commit}"
    return found[node]


UPSTREAM_NODES = sorted(n for n in upstream_object_info() if not n.startswith(PACK_PREFIX))


def test_every_upstream_node_names_its_source_and_every_template_node_is_transcribed() -> None:
    assert sorted(sources()) == UPSTREAM_NODES
    used = {
        node["class_type"]
        for stages in TEMPLATES.values()
        for name in stages.values()
        for node in load_template(name).values()
    }
    assert used <= set(upstream_object_info()), used - set(upstream_object_info())


@pytest.mark.parametrize("node", UPSTREAM_NODES)
def test_transcription_matches_the_upstream_source(node: str) -> None:
    require_upstream()
    problems, _ = compare(node, upstream_object_info()[node], upstream_schema(node))
    assert problems == [], "\n".join(problems)


def test_inputs_only_a_running_comfyui_knows_are_the_expected_ones() -> None:
    require_upstream()
    dynamic = set()
    for node in UPSTREAM_NODES:
        dynamic |= set(compare(node, upstream_object_info()[node], upstream_schema(node))[1])
    assert dynamic == DYNAMIC


def test_the_check_fails_on_the_drift_it_exists_for() -> None:
    """The transcription as it stood before Raylight c0495710, and a KSamplerAdvanced without its
    UI flags: each difference is one problem line (so the check can fail, and says where)."""
    require_upstream()
    info = copy.deepcopy(upstream_object_info())
    ray = info["RayInitializer"]["input"]["required"]
    del ray["dp_degree"], ray["clear_vram_after_sampling"]
    ray["skip_comm_test"][1]["default"] = True
    del info["XFuserKSamplerAdvanced"]["input"]["required"]["denoise"]
    ks = info["KSamplerAdvanced"]["input"]["required"]
    del ks["start_at_step"][1]["advanced"], ks["noise_seed"][1]["control_after_generate"]
    info["MiniMaxH3ImageToVideo"]["output_name"] = ["CONDITIONING", "LATENT"]
    info["VAEDecodeAudio"]["input"]["required"]["samples"] = ["IMAGE"]

    problems = []
    for node in (
        "RayInitializer",
        "XFuserKSamplerAdvanced",
        "KSamplerAdvanced",
        "MiniMaxH3ImageToVideo",
        "VAEDecodeAudio",
    ):
        problems += compare(node, info[node], upstream_schema(node))[0]
    assert problems == [
        "RayInitializer: required input 'clear_vram_after_sampling' (BOOLEAN default=False) is missing",
        "RayInitializer: required input 'dp_degree' (INT default=1, min=0) is missing",
        "RayInitializer.skip_comm_test: {'default': True}, upstream {'default': False}",
        "XFuserKSamplerAdvanced: required input 'denoise' (FLOAT default=1.0, max=1.0, min=0.0, step=0.01) is missing",
        "KSamplerAdvanced.noise_seed: {'default': 0, 'max': 18446744073709551615, 'min': 0}, "
        "upstream {'control_after_generate': True, 'default': 0, 'max': 18446744073709551615, 'min': 0}",
        "KSamplerAdvanced.start_at_step: {'default': 0, 'max': 10000, 'min': 0}, "
        "upstream {'advanced': True, 'default': 0, 'max': 10000, 'min': 0}",
        "MiniMaxH3ImageToVideo: output_name ['CONDITIONING', 'LATENT'], upstream ['positive', 'LATENT']",
        "VAEDecodeAudio.samples: type IMAGE, upstream LATENT",
    ]


def test_values_are_evaluated_from_constants_other_files_and_enums() -> None:
    """What the parser resolves without running anything: checked against the files' own text."""
    require_upstream()
    empty = upstream_schema("EmptyMiniMaxH3LatentAV")["input"]["required"]
    assert "MAX_RESOLUTION=16384" in read_upstream(*IMPORTED["nodes"])
    assert empty["width"] == ["INT", {"default": 1344, "min": 32, "max": 16384, "step": 32}]
    attention = upstream_schema("RayInitializer")["input"]["required"]["XFuser_attention"]
    members = re.findall(r"^    ([A-Z0-9_]+) = ", read_upstream(*IMPORTED["yunchang.kernels"]), re.M)
    assert attention[0] == members and "TORCH_EFFICIENT" in members
    i2v = upstream_schema("MiniMaxH3ImageToVideo")
    assert set(i2v["input"]["optional"]) == {"first_frame", "last_frame"}
    assert i2v["input"]["required"]["prompt"] == ["STRING", {"multiline": True, "dynamicPrompts": True}]


def test_both_stored_raylight_commits_define_the_same_four_nodes() -> None:
    """Raylight main at c0495710 (the issue's) and the newer eb820c20 (the transcription's) agree."""
    require_upstream()
    wanted = {"RayInitializer", "RayLoraLoader", "RayUNETLoader", "XFuserKSamplerAdvanced"}
    path = "src/raylight/nodes.py"
    old = node_schemas(parsed("komikndr/raylight", path, "c0495710d960c413443727b5c640e22d6bd9ef61"), wanted)
    new = node_schemas(parsed("komikndr/raylight", path, "eb820c204c6ddef3437c4864c1adb8b1dfea9877"), wanted)
    assert set(old) == set(new) == wanted
    assert old == new
