"""Workflow templates: placeholders, rendering, and the /object_info validator (no server).

The production templates cannot run here (no H3 weights, no GPUs); they are checked
against the node schemas transcribed from upstream ComfyUI and Raylight
(``h3flow/data/comfy_object_info_upstream.json``, commits in docs/comfyui.md).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from h3flow.core.errors import ConfigError, H3FlowError
from h3flow.engines.workflows import (
    TEMPLATES,
    WORKFLOWS_DIR,
    check_prompt,
    complete_prompt,
    load_template,
    render,
    template_parameters,
    upstream_object_info,
    validate_prompt,
)

REQUIRED_VALUES = {
    "image": "h3flow/0123.png",
    "prompt": "slow pan left over a calm lake",
    "out_path": "/data/out/x",
    "width": 736,
    "height": 416,
    "length": 124,
    "seed": 7,
    "cond_path": "/data/c.safetensors",
    "latent_path": "/data/l.h3latent",
    "frames": 124,
}


def filled(name: str, **overrides: object) -> dict:
    template = load_template(name)
    needed = {k for k, v in template_parameters(template).items() if v is ...}
    params = {k: REQUIRED_VALUES[k] for k in needed}
    params.update(overrides)
    return render(template, params, name=name)


@pytest.fixture(scope="module")
def schema() -> dict:
    return upstream_object_info()


def test_every_template_is_named_and_exists() -> None:
    names = {n for stages in TEMPLATES.values() for n in stages.values()}
    on_disk = {p.stem for p in WORKFLOWS_DIR.glob("*.json")}
    assert (
        names
        == on_disk
        == {"h3-encode", "h3-sample", "h3-sample-xtx", "h3-decode", "ref-encode", "ref-sample", "ref-decode"}
    )


@pytest.mark.parametrize(
    "name", ["h3-encode", "h3-sample", "h3-sample-xtx", "h3-decode", "ref-encode", "ref-sample", "ref-decode"]
)
def test_templates_validate_against_upstream_schemas(name: str, schema: dict) -> None:
    assert validate_prompt(filled(name), schema) == []


def test_production_templates_use_upstream_and_raylight_names(schema: dict) -> None:
    sample = filled("h3-sample")
    types = {n["class_type"] for n in sample.values()}
    assert {
        "RayInitializer",
        "RayUNETLoader",
        "RayLoraLoader",
        "XFuserKSamplerAdvanced",
        "EmptyMiniMaxH3LatentAV",
    } <= types
    ks = next(n for n in sample.values() if n["class_type"] == "XFuserKSamplerAdvanced")["inputs"]
    assert (ks["sampler_name"], ks["scheduler"], ks["steps"], ks["noise_seed"]) == ("euler", "simple", 6, 7)
    ray = next(n for n in sample.values() if n["class_type"] == "RayInitializer")["inputs"]
    assert (ray["ulysses_degree"], ray["FSDP"], ray["GPU"]) == (4, True, 4)
    encode = filled("h3-encode")
    assert {n["class_type"] for n in encode.values()} == {
        "LoadImage",
        "H3MultiGPUCLIPLoader",
        "VAELoader",
        "MiniMaxH3ImageToVideo",
        "H3SaveConditioning",
    }
    decode = filled("h3-decode")
    vae = [n["inputs"]["vae_name"] for n in decode.values() if n["class_type"] == "VAELoader"]
    assert "minimax_h3_video_vae_int8_convrot.safetensors" in vae
    xtx = filled("h3-sample-xtx")
    assert not any(n["class_type"].startswith(("Ray", "XFuser")) for n in xtx.values())


def test_render_keeps_types_defaults_and_embedded_text() -> None:
    template = {
        "1": {
            "class_type": "X",
            "inputs": {
                "a": "{{seed}}",
                "b": "{{steps|6}}",
                "c": "out/{{clip}}.mp4",
                "d": "{{flag|true}}",
                "e": ["2", 0],
            },
        },
    }
    out = render(template, {"seed": 11, "clip": "c01"})
    assert out["1"]["inputs"] == {"a": 11, "b": 6, "c": "out/c01.mp4", "d": True, "e": ["2", 0]}
    assert template["1"]["inputs"]["a"] == "{{seed}}"  # the template itself is untouched
    assert template_parameters(template) == {"seed": ..., "steps": 6, "clip": ..., "flag": True}


def test_render_rejects_unknown_and_missing_parameters() -> None:
    template = load_template("ref-sample")
    with pytest.raises(H3FlowError, match=r"unknown parameter\(s\) sed"):
        render(template, {"sed": 1, "cond_path": "c", "out_path": "o"}, name="ref-sample")
    with pytest.raises(H3FlowError, match="parameter 'seed' is required"):
        render(template, {"cond_path": "c", "out_path": "o"}, name="ref-sample")


def test_load_template_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_template("nope", tmp_path)
    (tmp_path / "bad.json").write_text('{"1": {"class_type": "X",}')
    with pytest.raises(ConfigError, match="invalid JSON at line 1"):
        load_template("bad", tmp_path)
    (tmp_path / "ui.json").write_text(json.dumps({"nodes": [], "links": []}))
    with pytest.raises(ConfigError, match="not a ComfyUI API-format prompt"):
        load_template("ui", tmp_path)


def test_validator_finds_a_missing_node_type(schema: dict) -> None:
    without_raylight = {k: v for k, v in schema.items() if not k.startswith(("Ray", "XFuser"))}
    problems = validate_prompt(filled("h3-sample"), without_raylight)
    assert "node 4 (RayInitializer): node type not installed on this ComfyUI" in problems
    assert "node 7 (XFuserKSamplerAdvanced): node type not installed on this ComfyUI" in problems
    with pytest.raises(H3FlowError, match=r"h3-sample does not fit this ComfyUI: .*RayInitializer"):
        check_prompt(filled("h3-sample"), without_raylight, name="h3-sample")


def test_validator_finds_missing_and_unknown_inputs(schema: dict) -> None:
    prompt = filled("h3-sample")
    del prompt["7"]["inputs"]["noise_seed"]
    prompt["6"]["inputs"]["unet"] = "x"
    problems = validate_prompt(prompt, schema)
    assert "node 7 (XFuserKSamplerAdvanced): required input 'noise_seed' missing" in problems
    assert any(p.startswith("node 6 (RayUNETLoader): unknown input 'unet'") for p in problems)


def test_validator_finds_combo_values_outside_the_options(schema: dict) -> None:
    prompt = filled("h3-sample", sampler_name="eulr", unet_name="minimax_h3_fp16.safetensors")
    problems = validate_prompt(prompt, schema)
    assert any(
        p.startswith("node 7 (XFuserKSamplerAdvanced): input 'sampler_name' value 'eulr' not among the options")
        for p in problems
    )
    assert any("input 'unet_name' value 'minimax_h3_fp16.safetensors' not among the options" in p for p in problems)
    # XTX: an attention backend that Raylight's RayInitializer does not offer is caught too
    bad = filled("h3-sample", attention="FLASH_MAGIC")
    assert any("'XFuser_attention' value 'FLASH_MAGIC'" in p for p in validate_prompt(bad, schema))


def test_validator_checks_links_ranges_and_types(schema: dict) -> None:
    prompt = filled("h3-decode")
    broken = copy.deepcopy(prompt)
    broken["4"]["inputs"]["samples"] = ["9", 0]
    assert "node 4 (VAEDecode): input 'samples' links to missing node 9" in validate_prompt(broken, schema)
    broken = copy.deepcopy(prompt)
    broken["4"]["inputs"]["samples"] = ["2", 0]  # a VAE where a LATENT belongs
    assert "node 4 (VAEDecode): input 'samples' wants LATENT but node 2 output 0 is VAE" in validate_prompt(
        broken, schema
    )
    broken = copy.deepcopy(prompt)
    broken["4"]["inputs"]["samples"] = ["1", 3]
    assert "node 4 (VAEDecode): input 'samples' links to output 3 of node 1, which has 1" in validate_prompt(
        broken, schema
    )
    steps = filled("h3-sample-xtx", steps=0)
    assert "node 6 (KSamplerAdvanced): input 'steps' value 0 below min 1" in validate_prompt(steps, schema)
    flag = filled("h3-encode", offload_after_encode="yes")
    assert "node 2 (H3MultiGPUCLIPLoader): input 'offload_after_encode' wants BOOLEAN, got 'yes'" in validate_prompt(
        flag, schema
    )


def test_complete_prompt_fills_declared_defaults_and_names_the_rest(schema: dict) -> None:
    drifted = copy.deepcopy(schema)
    ray = drifted["RayInitializer"]["input"]["required"]
    ray["pipefusion_degree"] = ["INT", {"default": 2, "min": 1}]
    ray["attention_mode"] = [["ring", "ulysses"]]  # a combo without a declared default
    drifted["XFuserKSamplerAdvanced"]["input"]["required"]["sigma_shift"] = ["FLOAT", {"default": 12.0}]
    prompt = filled("h3-sample")
    done = complete_prompt(prompt, drifted, template="h3-sample")
    assert [(f.node_id, f.class_type, f.name, f.value) for f in done.filled] == [
        ("4", "RayInitializer", "pipefusion_degree", 2),
        ("7", "XFuserKSamplerAdvanced", "sigma_shift", 12.0),
    ]
    assert done.filled[0].line("h3-sample") == (
        "h3-sample: node 4 (RayInitializer) input 'pipefusion_degree' is not set by the template; "
        "using this ComfyUI's default 2"
    )
    assert done.unfillable == [
        "h3-sample: node 4 (RayInitializer) requires input 'attention_mode', which the template does not set and "
        "this ComfyUI gives no default for: set it to one of ['ring', 'ulysses'] in workflows/h3-sample.json"
    ]
    assert done.prompt["4"]["inputs"]["pipefusion_degree"] == 2 and "pipefusion_degree" not in prompt["4"]["inputs"]
    assert validate_prompt(done.prompt, drifted, missing_required=False) == []
    assert "node 4 (RayInitializer): required input 'attention_mode' missing" in validate_prompt(done.prompt, drifted)
    # what the template sets is never overridden, and a node type the server lacks is left to the validator
    untouched = complete_prompt(filled("h3-sample", steps=9), {}, template="h3-sample")
    assert untouched.prompt == filled("h3-sample", steps=9) and not untouched.filled and not untouched.unfillable


def test_an_input_the_server_renamed_is_a_problem_not_a_silent_default(schema: dict) -> None:
    """Raylight renaming ``FSDP`` to ``fsdp``: ComfyUI would ignore our ``FSDP: true`` and run
    with ``fsdp`` at its default (False), FSDP silently off. The completion names it instead."""
    drifted = copy.deepcopy(schema)
    ray = drifted["RayInitializer"]["input"]["required"]
    ray["fsdp"] = ray.pop("FSDP")
    done = complete_prompt(filled("h3-sample"), drifted, template="h3-sample")
    assert [(f.node_id, f.name, f.value) for f in done.filled] == [("4", "fsdp", False)]  # what ComfyUI would do
    inputs = ", ".join(sorted(ray))
    assert done.unknown == [
        "h3-sample: node 4 (RayInitializer) sets input 'FSDP', which this ComfyUI's RayInitializer does not have "
        f"(renamed 'fsdp'?); its inputs: {inputs}. ComfyUI would run the node without that value: "
        "fix workflows/h3-sample.json"
    ]
    assert done.problems == done.unfillable + done.unknown == done.unknown
    # an input with no likely new name gets no guess; optional and hidden inputs are known inputs
    gone = copy.deepcopy(schema)
    del gone["XFuserKSamplerAdvanced"]["input"]["required"]["denoise"]
    (line,) = complete_prompt(filled("h3-sample"), gone, template="h3-sample").unknown
    assert (
        line.startswith("h3-sample: node 7 (XFuserKSamplerAdvanced) sets input 'denoise', which")
        and "renamed" not in line
    )
    assert complete_prompt(filled("h3-sample"), schema, template="h3-sample").problems == []
    hidden = copy.deepcopy(schema)
    hidden["H3LoadConditioning"]["input"]["hidden"] = {"unique_id": "UNIQUE_ID"}
    assert complete_prompt(filled("h3-sample", cond_sha256="ab"), hidden, template="h3-sample").unknown == []
