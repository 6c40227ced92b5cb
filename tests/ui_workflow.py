"""ComfyUI's UI-format workflows (what the editor saves and its Templates browser loads),
turned into API-format prompts the way the frontend does it, against ``/object_info``.

A UI workflow stores each node's widget values as a list (``widgets_values``) in the
order of its widget inputs, with extra entries the frontend adds: the "control after
generate" choice after an INT with ``control_after_generate`` (a seed), and the upload
button's value after a combo with ``image_upload``. A list that does not line up shows
as NaN or a wrong value in the editor, which is what :func:`to_api` catches.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
VIRTUAL = {"MarkdownNote", "Note"}  # editor-only nodes: never part of the prompt
CONTROL_VALUES = {"fixed", "increment", "decrement", "randomize"}


def _spec(spec: Any) -> tuple[str, dict[str, Any]]:
    head = spec[0]
    opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    return ("COMBO" if isinstance(head, list) else str(head)), opts


def inputs_of(schema: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any], bool]]:
    """(name, type, options, optional) of a node's inputs, required first, in schema order."""
    out = []
    for section in ("required", "optional"):
        for name, spec in ((schema.get("input") or {}).get(section) or {}).items():
            kind, opts = _spec(spec)
            out.append((name, kind, opts, section == "optional"))
    return out


def widget_slots(schema: Mapping[str, Any]) -> list[str | None]:
    """The meaning of each ``widgets_values`` entry: an input name, or None for a frontend extra."""
    slots: list[str | None] = []
    for name, kind, opts, _ in inputs_of(schema):
        if kind not in WIDGET_TYPES or opts.get("forceInput"):
            continue
        slots.append(name)
        if opts.get("control_after_generate"):
            slots.append(None)
        if opts.get("image_upload") or opts.get("upload"):
            slots.append(None)
    return slots


def to_api(workflow: Mapping[str, Any], object_info: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(API-format prompt, problems) of a UI workflow; muted and bypassed nodes are left out."""
    problems: list[str] = []
    links = {link[0]: link for link in workflow.get("links", [])}
    nodes = {node["id"]: node for node in workflow.get("nodes", [])}
    prompt: dict[str, Any] = {}
    for node in workflow.get("nodes", []):
        where = f"node {node['id']} ({node.get('type')})"
        if node.get("mode", 0) != 0 or node.get("type") in VIRTUAL:
            continue
        schema = object_info.get(node.get("type"))
        if schema is None:
            problems.append(f"{where}: unknown node type")
            continue
        inputs: dict[str, Any] = {}
        slots = widget_slots(schema)
        values = list(node.get("widgets_values") or [])
        if len(values) != len(slots):
            problems.append(f"{where}: {len(values)} widget values for {len(slots)} widgets {slots}")
        for slot, value in zip(slots, values, strict=False):
            if isinstance(value, float) and not math.isfinite(value):
                problems.append(f"{where}: widget {slot} is {value}")
            if value is None or (isinstance(value, str) and "{{" in value):
                problems.append(f"{where}: widget {slot} is a placeholder ({value!r})")
            if slot is None:
                if not (value in CONTROL_VALUES or value in ("image", "upload")):
                    problems.append(f"{where}: frontend widget value {value!r} is neither a seed control nor upload")
                continue
            inputs[slot] = value
        kinds = {name: kind for name, kind, _, _ in inputs_of(schema)}
        for socket in node.get("inputs") or []:
            if socket.get("link") is None:
                continue
            link = links.get(socket["link"])
            if link is None:
                problems.append(f"{where}: input {socket['name']} names missing link {socket['link']}")
                continue
            _, src, slot, dst, _, kind = link[:6]
            source = nodes.get(src)
            if dst != node["id"] or source is None:
                problems.append(f"{where}: link {link[0]} does not end here or starts nowhere")
                continue
            wanted = kinds.get(socket["name"])
            if source["type"] not in object_info:
                inputs[socket["name"]] = [str(src), slot]
                continue  # reported on its own node
            produced = object_info[source["type"]].get("output", [])
            if slot >= len(produced) or produced[slot] != kind or wanted not in (kind, "*"):
                problems.append(f"{where}: link {link[0]} carries {kind}, input {socket['name']} wants {wanted}")
            inputs[socket["name"]] = [str(src), slot]
        prompt[str(node["id"])] = {"class_type": node["type"], "inputs": inputs}
    return prompt, problems
