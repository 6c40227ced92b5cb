"""Write the node pack's UI-format example workflows (comfy_nodes/h3flow_nodes/example_workflows/).

ComfyUI's Templates browser lists every ``custom_nodes/<pack>/example_workflows/*.json``.
Each workflow here is a short list of nodes with their widget values *by name*; the
``widgets_values`` lists, sockets and links are derived from the node schemas in
h3flow/data/comfy_object_info_upstream.json (the pack's own and upstream's), so the
order the editor expects cannot drift from them. tests/test_comfy_pack.py checks the
files against this script and loads each one; tests/test_comfy_server.py runs the
reference ones on a real ComfyUI.

Usage: python scripts/make_example_workflows.py [--check]
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the UI-format rules shared with the tests

from ui_workflow import inputs_of, widget_slots  # noqa: E402

from h3flow.core.paths import NODE_PACK_DIR  # noqa: E402
from h3flow.engines.workflows import upstream_object_info  # noqa: E402

OUT = NODE_PACK_DIR / "example_workflows"
IMAGE = "example.png"  # ComfyUI ships input/example.png; upload your own over it
PROMPT = "slow pan left over a calm lake at sunset"
H3_FILES = {
    "clip": "qwen3vl_32b_minimax_h3_int8_convrot.safetensors",
    "vae": "minimax_h3_video_vae_int8_convrot.safetensors",
    "audio_vae": "minimax_h3_audio_vae_fp32.safetensors",
    "unet": "minimax_h3_fl2va_pruned_int8_convrot.safetensors",
    "lora": "minimax_h3_fl2v_lightx2v_turbo_4step_v0.1_comfy.safetensors",
}


@dataclass
class Node:
    id: int
    type: str
    pos: tuple[int, int]
    widgets: dict[str, Any] = field(default_factory=dict)
    links: dict[str, tuple[int, int]] = field(default_factory=dict)  # input -> (source node, output slot)
    title: str | None = None
    size: tuple[int, int] = (340, 130)


def note(node_id: int, pos: tuple[int, int], text: str, size: tuple[int, int] = (420, 160)) -> dict[str, Any]:
    """A Markdown note: shown in the editor, never sent to the server."""
    return {
        "id": node_id,
        "type": "MarkdownNote",
        "pos": list(pos),
        "size": list(size),
        "flags": {},
        "order": 0,
        "mode": 0,
        "inputs": [],
        "outputs": [],
        "properties": {},
        "widgets_values": [text],
        "color": "#432",
        "bgcolor": "#653",
    }


def build(nodes: list[Node], notes: list[dict[str, Any]]) -> dict[str, Any]:
    info = upstream_object_info()
    links: list[list[Any]] = []
    by_id = {n.id: n for n in nodes}
    out_links: dict[tuple[int, int], list[int]] = {}
    for node in nodes:
        for name, (src, slot) in node.links.items():
            kind = info[by_id[src].type]["output"][slot]
            links.append([len(links) + 1, src, slot, node.id, name, kind])
            out_links.setdefault((src, slot), []).append(len(links))
    ui_nodes = []
    for order, node in enumerate(nodes):
        schema = info[node.type]
        sockets = []
        for name, kind, opts, optional in inputs_of(schema):
            if kind in ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO") and not opts.get("forceInput"):
                continue
            link = next((ln[0] for ln in links if ln[3] == node.id and ln[4] == name), None)
            sockets.append({"name": name, "type": kind, "link": link, **({"shape": 7} if optional else {})})
        values: list[Any] = []
        for slot in widget_slots(schema):
            if slot is None:  # the frontend's own widget after a seed / an upload combo
                values.append("image" if values and node.type == "LoadImage" else "fixed")
                continue
            spec = {n: o for n, _, o, _ in inputs_of(schema)}[slot]
            values.append(node.widgets[slot] if slot in node.widgets else spec["default"])
        unknown = set(node.widgets) - {s for s in widget_slots(schema) if s}
        if unknown:
            raise SystemExit(f"{node.type}: no widgets {sorted(unknown)}")
        ui_nodes.append(
            {
                "id": node.id,
                "type": node.type,
                "pos": list(node.pos),
                "size": list(node.size),
                "flags": {},
                "order": order,
                "mode": 0,
                "inputs": sockets,
                "outputs": [
                    {"name": name, "type": kind, "links": out_links.get((node.id, slot), []), "slot_index": slot}
                    for slot, (name, kind) in enumerate(zip(schema["output_name"], schema["output"], strict=True))
                ],
                "properties": {"Node name for S&R": node.type},
                "widgets_values": values,
                **({"title": node.title} if node.title else {}),
            }
        )
    for link in links:  # [id, from node, from slot, to node, to input *slot*, type]
        target = next(n for n in ui_nodes if n["id"] == link[3])
        link[4] = next(i for i, s in enumerate(target["inputs"]) if s["name"] == link[4])
    all_nodes = ui_nodes + notes
    return {
        "last_node_id": max(n["id"] for n in all_nodes),
        "last_link_id": len(links),
        "nodes": all_nodes,
        "links": links,
        "groups": [],
        "config": {},
        "extra": {"ds": {"scale": 0.9, "offset": [0, 0]}},
        "version": 0.4,
    }


ENCODE = [
    Node(1, "LoadImage", (40, 120), {"image": IMAGE}, title="Reference image (first frame)", size=(320, 330)),
    Node(2, "H3ReferenceEncode", (400, 120), {"prompt": PROMPT, "spec": "tiny", "frames": 39}, {"image": (1, 0)}),
    Node(3, "H3SaveConditioning", (800, 120), {"path": "h3flow/example.cond.safetensors"}, {"conditioning": (2, 0)}),
]
SAMPLE = [
    Node(1, "H3LoadConditioning", (40, 120), {"path": "h3flow/example.cond.safetensors", "sha256": ""}),
    Node(2, "H3ReferenceSample", (420, 120), {"seed": 11, "steps": 4}, {"conditioning": (1, 0)}),
    Node(
        3,
        "H3LatentHandoffSave",
        (800, 120),
        {"path": "h3flow/example.h3latent", "meta": '{"clip_id": "example", "seed": 11}'},
        {"samples": (2, 0)},
        size=(360, 180),
    ),
]
DECODE = [
    Node(1, "H3LatentHandoffLoad", (40, 120), {"path": "h3flow/example.h3latent", "sha256": ""}),
    Node(2, "H3ReferenceDecode", (420, 120), {"int8": True}, {"samples": (1, 0)}),
    Node(
        3,
        "H3SaveVideoAAC",
        (800, 120),
        {"path": "h3flow/example.mp4", "fps": 24.0},
        {"images": (2, 0), "audio": (2, 1)},
        size=(360, 400),
    ),
]
PIPELINE = [
    Node(1, "LoadImage", (40, 120), {"image": IMAGE}, title="Reference image (first frame)", size=(320, 330)),
    Node(2, "H3ReferenceEncode", (400, 120), {"prompt": PROMPT, "spec": "tiny", "frames": 39}, {"image": (1, 0)}),
    Node(3, "H3ReferenceSample", (800, 120), {"seed": 11, "steps": 4}, {"conditioning": (2, 0)}),
    Node(
        4,
        "H3LatentHandoffSave",
        (1180, 420),
        {"path": "h3flow/example_pipeline.h3latent", "meta": '{"clip_id": "example_pipeline", "seed": 11}'},
        {"samples": (3, 0)},
        title="Latent handoff (what a sampler host sends a decoder host)",
        size=(360, 180),
    ),
    Node(5, "H3ReferenceDecode", (1180, 120), {"int8": True}, {"samples": (3, 0)}),
    Node(
        6,
        "H3SaveVideoAAC",
        (1560, 120),
        {"path": "h3flow/example_pipeline.mp4", "fps": 24.0},
        {"images": (5, 0), "audio": (5, 1)},
        size=(360, 400),
    ),
]
H3_SAMPLE = [
    Node(1, "LoadImage", (40, 120), {"image": IMAGE}, title="Reference image (first frame)", size=(320, 330)),
    Node(2, "CLIPLoader", (40, 500), {"clip_name": H3_FILES["clip"], "type": "minimax", "device": "default"}),
    Node(3, "VAELoader", (40, 680), {"vae_name": H3_FILES["vae"]}),
    Node(
        4,
        "MiniMaxH3ImageToVideo",
        (420, 120),
        {"prompt": PROMPT, "width": 736, "height": 416, "length": 124},
        {"clip": (2, 0), "vae": (3, 0), "first_frame": (1, 0)},
        size=(380, 330),
    ),
    Node(5, "UNETLoader", (420, 500), {"unet_name": H3_FILES["unet"], "weight_dtype": "default"}),
    Node(
        6, "LoraLoaderModelOnly", (420, 680), {"lora_name": H3_FILES["lora"], "strength_model": 1.0}, {"model": (5, 0)}
    ),
    Node(
        7, "ConditioningZeroOut", (860, 500), {}, {"conditioning": (4, 0)}, title="Negative (cfg 1 with the Turbo LoRA)"
    ),
    Node(
        8,
        "KSamplerAdvanced",
        (860, 120),
        {
            "add_noise": "enable",
            "noise_seed": 11,
            "steps": 6,
            "cfg": 1.0,
            "sampler_name": "euler",
            "scheduler": "simple",
            "start_at_step": 0,
            "end_at_step": 10000,
            "return_with_leftover_noise": "disable",
        },
        {"model": (6, 0), "positive": (4, 0), "negative": (7, 0), "latent_image": (4, 1)},
        size=(340, 340),
    ),
    Node(
        9,
        "H3LatentHandoffSave",
        (1240, 120),
        {"path": "h3flow/h3_clip.h3latent", "meta": '{"clip_id": "h3_clip", "seed": 11}'},
        {"samples": (8, 0)},
        size=(360, 180),
    ),
]
H3_DECODE = [
    Node(1, "H3LatentHandoffLoad", (40, 120), {"path": "h3flow/h3_clip.h3latent", "sha256": ""}),
    Node(2, "VAELoader", (40, 330), {"vae_name": H3_FILES["vae"]}, title="INT8 video VAE"),
    Node(3, "VAELoader", (40, 480), {"vae_name": H3_FILES["audio_vae"]}, title="Audio VAE"),
    Node(4, "VAEDecode", (420, 120), {}, {"samples": (1, 0), "vae": (2, 0)}, title="Video decode (the video stream)"),
    Node(
        5, "VAEDecodeAudio", (420, 330), {}, {"samples": (1, 0), "vae": (3, 0)}, title="Audio decode (the audio stream)"
    ),
    Node(
        6,
        "H3SaveVideoAAC",
        (800, 120),
        {"path": "h3flow/h3_clip.mp4", "fps": 24.0},
        {"images": (4, 0), "audio": (5, 0)},
        size=(360, 400),
    ),
]

REFERENCE_NOTE = (
    "**h3flow reference model** (no weights, runs on CPU): MiniMax H3's exact latent layout with a "
    "patch VAE, a prompt-driven camera path and music. Files go to ComfyUI's `output/h3flow/`. "
    "Load your own picture in *Load Image*."
)
WORKFLOWS = {
    "h3flow_1_reference_encode": (
        ENCODE,
        [note(10, (400, 380), REFERENCE_NOTE + "\n\nStage 1 of 3: image + prompt -> conditioning file.")],
    ),
    "h3flow_2_reference_sample": (
        SAMPLE,
        [note(10, (40, 330), REFERENCE_NOTE + "\n\nStage 2 of 3: conditioning -> `.h3latent` (run stage 1 first).")],
    ),
    "h3flow_3_reference_decode": (
        DECODE,
        [note(10, (40, 330), REFERENCE_NOTE + "\n\nStage 3 of 3: `.h3latent` -> MP4 (run stage 2 first).")],
    ),
    "h3flow_4_reference_pipeline": (
        PIPELINE,
        [note(10, (400, 420), REFERENCE_NOTE + "\n\nThe whole pipeline in one graph: image + prompt -> MP4.")],
    ),
    "h3flow_5_minimax_h3_sample_handoff": (
        H3_SAMPLE,
        [
            note(
                20,
                (1240, 340),
                "**MiniMax H3 on one GPU, handed off as a latent file.** Needs a ComfyUI with MiniMax H3 "
                "(`comfy_extras/nodes_minimax_h3.py`) and the H3 files in `models/`. The `.h3latent` "
                "holds the video and audio latents (SaveLatent cannot store the pair); decode it with "
                "workflow 6 on any host. On several 16 GB GPUs use *H3 Multi-GPU CLIP Loader* instead of "
                "*Load CLIP*.",
                size=(420, 220),
            )
        ],
    ),
    "h3flow_6_minimax_h3_decode_handoff": (
        H3_DECODE,
        [
            note(
                20,
                (800, 560),
                "**MiniMax H3 decode from a latent file** (from workflow 5 or h3flow's samplers): "
                "VAEDecode takes the video stream, VAEDecodeAudio the audio stream, the save node "
                "writes H.264 + AAC and plays it here.",
            )
        ],
    ),
}


def render_all() -> dict[str, str]:
    return {
        f"{name}.json": json.dumps(build(nodes, notes), indent=1) + "\n" for name, (nodes, notes) in WORKFLOWS.items()
    }


def main(argv: list[str]) -> int:
    files = render_all()
    if "--check" in argv:
        stale = [n for n, text in files.items() if not (OUT / n).is_file() or (OUT / n).read_text() != text]
        print("stale: " + ", ".join(stale) if stale else "up to date")
        return 1 if stale else 0
    OUT.mkdir(exist_ok=True)
    for old in OUT.glob("*.json"):
        if old.name not in files:
            old.unlink()
    for name, text in files.items():
        (OUT / name).write_text(text)
    print(f"wrote {len(files)} workflows to {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
