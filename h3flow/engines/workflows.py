"""Workflow templates (``workflows/*.json``): load, fill in, and check against a ComfyUI.

A template is a ComfyUI API-format prompt (``{node_id: {class_type, inputs, _meta}}``)
in which a string value may be a placeholder:

- ``"{{seed}}"`` — the whole value is replaced by the parameter, keeping its JSON type;
- ``"{{steps|6}}"`` — the same with a default (a JSON literal after ``|``);
- ``"clips/{{clip_id}}.h3latent"`` — placeholders inside a longer string become text.

:func:`validate_prompt` checks a prompt against a server's ``/object_info`` (missing
node types, missing or unknown inputs, links to missing nodes or outputs, values
outside a combo's options or an INT/FLOAT's range) so ``preflight`` can catch a
host without Raylight, an old ComfyUI or a missing model file before any GPU work.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from h3flow.core.errors import ConfigError, H3FlowError
from h3flow.core.paths import WORKFLOWS_DIR

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\|\s*(.*?)\s*)?\}\}")
WHOLE = re.compile(r"^\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\|\s*(.*?)\s*)?\}\}$")
UPSTREAM_SCHEMA = "comfy_object_info_upstream.json"

# The templates each stage uses: production (H3 + Raylight) and the reference model.
TEMPLATES = {
    "production": {"encode": "h3-encode", "sample": "h3-sample", "decode": "h3-decode"},
    "xtx": {"encode": "h3-encode", "sample": "h3-sample-xtx", "decode": "h3-decode"},
    "reference": {"encode": "ref-encode", "sample": "ref-sample", "decode": "ref-decode"},
}


def load_template(name: str, templates_dir: Path | None = None) -> dict[str, Any]:
    """Read ``workflows/NAME.json`` (a name or a path)."""
    path = Path(name)
    if path.suffix != ".json":
        path = Path(templates_dir or WORKFLOWS_DIR) / f"{name}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"workflow template {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict) or not all(isinstance(n, dict) and "class_type" in n for n in data.values()):
        raise ConfigError(f"{path}: not a ComfyUI API-format prompt ({{id: {{class_type, inputs}}}})")
    return data


def template_parameters(template: Mapping[str, Any]) -> dict[str, Any]:
    """``{name: default or ...}`` for every placeholder (``...`` when it has no default)."""
    found: dict[str, Any] = {}

    def visit(value: Any) -> None:
        if isinstance(value, str):
            for match in PLACEHOLDER.finditer(value):
                name, default = match.group(1), match.group(2)
                if default is not None:
                    found[name] = json.loads(default)
                else:
                    found.setdefault(name, ...)
        elif isinstance(value, list):
            for item in value:
                visit(item)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)

    visit(template)
    return found


def render(template: Mapping[str, Any], params: Mapping[str, Any], *, name: str = "template") -> dict[str, Any]:
    """Fill the placeholders; unknown or missing parameters are errors (typos surface)."""
    known = template_parameters(template)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise H3FlowError(f"{name}: unknown parameter(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")

    def value_of(pname: str, default: str | None) -> Any:
        if pname in params:
            return params[pname]
        if default is not None:
            return json.loads(default)
        raise H3FlowError(f"{name}: parameter {pname!r} is required")

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            whole = WHOLE.match(value)
            if whole:
                return value_of(whole.group(1), whole.group(2))
            return PLACEHOLDER.sub(lambda m: str(value_of(m.group(1), m.group(2))), value)
        if isinstance(value, list):
            return [fill(item) for item in value]
        if isinstance(value, dict):
            return {key: fill(item) for key, item in value.items()}
        return value

    return fill(copy.deepcopy(dict(template)))


def upstream_object_info() -> dict[str, Any]:
    """The node schemas transcribed from upstream ComfyUI + Raylight + the h3flow pack."""
    text = resources.files("h3flow").joinpath("data", UPSTREAM_SCHEMA).read_text(encoding="utf-8")
    data = json.loads(text)
    return {k: v for k, v in data.items() if not k.startswith("_")}


# ---------------------------------------------------------------------------- validation
def _input_specs(schema: Mapping[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """All settable inputs of a node schema, and the names of the required ones."""
    inputs = schema.get("input", {})
    required = dict(inputs.get("required", {}) or {})
    optional = dict(inputs.get("optional", {}) or {})
    return {**required, **optional}, set(required)


def _spec_type(spec: Any) -> tuple[str | None, list[Any] | None, dict[str, Any]]:
    """(type name, combo options or None, options dict) of one /object_info input spec."""
    if not isinstance(spec, (list, tuple)) or not spec:
        return None, None, {}
    head = spec[0]
    opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    if isinstance(head, list):
        return "COMBO", list(head), opts
    if head == "COMBO":
        return "COMBO", list(opts.get("options", [])), opts
    return str(head), None, opts


def _is_link(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)


def _types_match(produced: str, wanted: str | None) -> bool:
    if wanted is None or produced == "*" or wanted == "*":
        return True
    return bool(set(produced.split(",")) & set(wanted.split(",")))


def validate_prompt(
    prompt: Mapping[str, Any], object_info: Mapping[str, Any], *, missing_required: bool = True
) -> list[str]:
    """Every problem of an API-format prompt against ``/object_info``, one line each.

    ``missing_required=False`` leaves out required inputs the prompt lacks (for a prompt
    :func:`complete_prompt` has already been through, which reports those itself).
    """
    problems: list[str] = []
    for node_id, node in sorted(prompt.items(), key=lambda kv: str(kv[0])):
        ctype = node.get("class_type")
        where = f"node {node_id} ({ctype})"
        schema = object_info.get(ctype) if isinstance(ctype, str) else None
        if schema is None:
            problems.append(f"{where}: node type not installed on this ComfyUI")
            continue
        specs, required = _input_specs(schema)
        given = node.get("inputs", {}) or {}
        for missing in sorted(required - set(given)) if missing_required else []:
            problems.append(f"{where}: required input {missing!r} missing")
        for key, value in given.items():
            if key not in specs:
                problems.append(f"{where}: unknown input {key!r} (accepts {', '.join(sorted(specs)) or 'none'})")
                continue
            kind, options, opts = _spec_type(specs[key])
            if _is_link(value):
                src_id, slot = value
                src = prompt.get(src_id)
                if src is None:
                    problems.append(f"{where}: input {key!r} links to missing node {src_id}")
                    continue
                src_schema = object_info.get(src.get("class_type"))
                if src_schema is None:
                    continue  # reported on its own node
                outputs = src_schema.get("output", [])
                if slot >= len(outputs):
                    problems.append(
                        f"{where}: input {key!r} links to output {slot} of node {src_id}, which has {len(outputs)}"
                    )
                elif not _types_match(str(outputs[slot]), kind if kind != "COMBO" else None):
                    problems.append(
                        f"{where}: input {key!r} wants {kind} but node {src_id} output {slot} is {outputs[slot]}"
                    )
                continue
            if kind == "COMBO" and options is not None:
                if opts.get("image_upload") or opts.get("upload"):
                    continue  # an upload target: files arrive with the prompt (LoadImage checks itself)
                if value not in options:
                    shown = ", ".join(map(repr, options[:12])) + (" ..." if len(options) > 12 else "")
                    problems.append(f"{where}: input {key!r} value {value!r} not among the options [{shown}]")
            elif kind in ("INT", "FLOAT"):
                if (
                    isinstance(value, bool)
                    or not isinstance(value, (int, float))
                    or (kind == "INT" and not isinstance(value, int))
                ):
                    problems.append(f"{where}: input {key!r} wants {kind}, got {value!r}")
                else:
                    if "min" in opts and value < opts["min"]:
                        problems.append(f"{where}: input {key!r} value {value} below min {opts['min']}")
                    if "max" in opts and value > opts["max"]:
                        problems.append(f"{where}: input {key!r} value {value} above max {opts['max']}")
            elif kind == "BOOLEAN" and not isinstance(value, bool):
                problems.append(f"{where}: input {key!r} wants BOOLEAN, got {value!r}")
            elif kind == "STRING" and not isinstance(value, str):
                problems.append(f"{where}: input {key!r} wants STRING, got {value!r}")
            elif kind not in ("COMBO", "INT", "FLOAT", "BOOLEAN", "STRING", None):
                problems.append(f"{where}: input {key!r} wants a {kind} link, got the value {value!r}")
    return problems


@dataclass(frozen=True)
class FilledInput:
    """A required input a template does not set, filled with the server's declared default."""

    node_id: str
    class_type: str
    name: str
    value: Any

    def line(self, template: str) -> str:
        return (
            f"{template}: node {self.node_id} ({self.class_type}) input {self.name!r} is not set by the template; "
            f"using this ComfyUI's default {self.value!r}"
        )


@dataclass(frozen=True)
class Completion:
    """A prompt with the server's defaults filled in, what was filled, what could not be, and
    the inputs the server does not know."""

    prompt: dict[str, Any]
    filled: list[FilledInput]
    unfillable: list[str]  # one line each: node, input and the fix
    unknown: list[str] = field(default_factory=list)  # one line each: node, input, the server's inputs

    @property
    def problems(self) -> list[str]:
        """What stops the prompt from running as the template means it."""
        return self.unfillable + self.unknown


def _wanted(spec: Any) -> str:
    kind, options, _ = _spec_type(spec)
    if kind == "COMBO" and options is not None:
        shown = ", ".join(map(repr, options[:8])) + (" ..." if len(options) > 8 else "")
        return f"one of [{shown}]"
    return f"a {kind} link" if kind not in ("INT", "FLOAT", "BOOLEAN", "STRING", None) else f"a {kind} value"


def complete_prompt(prompt: Mapping[str, Any], object_info: Mapping[str, Any], *, template: str) -> Completion:
    """Fill each required input the prompt leaves out with the default the server declares.

    Upstream nodes gain required inputs (Raylight's ``dp_degree``); a template written
    before that would be rejected by ComfyUI. Where the server's ``/object_info`` gives a
    default, that is what ComfyUI's own UI would put there, so it is filled in and
    reported; where it gives none (a link, a combo without a declared default), the
    template must say: one line naming the node, the input and the fix.

    An input the template sets that the server's node does not have is a problem too
    (``unknown``): ComfyUI ignores it and runs the node with the input's new name at its
    default, so a renamed upstream input (Raylight's ``FSDP`` becoming ``fsdp``) would
    silently turn a setting off. Node types the server lacks are left to :func:`validate_prompt`.
    """
    out = copy.deepcopy(dict(prompt))
    filled: list[FilledInput] = []
    unfillable: list[str] = []
    unknown: list[str] = []
    for node_id, node in sorted(out.items(), key=lambda kv: str(kv[0])):
        ctype = node.get("class_type")
        schema = object_info.get(ctype) if isinstance(ctype, str) else None
        if schema is None:
            continue
        sections = schema.get("input") or {}
        required = sections.get("required") or {}
        inputs = node.setdefault("inputs", {})
        known = {*required, *(sections.get("optional") or {}), *(sections.get("hidden") or {})}
        for name in sorted(set(inputs) - known):
            unknown.append(_unknown_line(template, str(node_id), ctype, name, known))
        for name, spec in required.items():
            if name in inputs:
                continue
            _, _, opts = _spec_type(spec)
            if "default" in opts and opts["default"] is not None:
                inputs[name] = copy.deepcopy(opts["default"])
                filled.append(FilledInput(str(node_id), ctype, name, opts["default"]))
            else:
                unfillable.append(
                    f"{template}: node {node_id} ({ctype}) requires input {name!r}, which the template does not set "
                    f"and this ComfyUI gives no default for: set it to {_wanted(spec)} in workflows/{template}.json"
                )
    return Completion(out, filled, unfillable, unknown)


def _unknown_line(template: str, node_id: str, ctype: str, name: str, known: set[str]) -> str:
    """One line for an input the server's node does not have: its inputs, and the likeliest rename."""
    by_case = [k for k in known if k.lower() == name.lower()]
    close = by_case or difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
    hint = f" (renamed {close[0]!r}?)" if close else ""
    return (
        f"{template}: node {node_id} ({ctype}) sets input {name!r}, which this ComfyUI's {ctype} does not have"
        f"{hint}; its inputs: {', '.join(sorted(known)) or 'none'}. ComfyUI would run the node without that value: "
        f"fix workflows/{template}.json"
    )


def check_prompt(prompt: Mapping[str, Any], object_info: Mapping[str, Any], *, name: str = "workflow") -> None:
    """Raise one H3FlowError listing every problem :func:`validate_prompt` finds."""
    problems = validate_prompt(prompt, object_info)
    if problems:
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        raise H3FlowError(f"{name} does not fit this ComfyUI: " + "; ".join(problems[:5]) + more)
