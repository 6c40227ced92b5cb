"""Node schemas read from upstream Python sources with ``ast``: never imported, never run.

ComfyUI nodes declare their inputs in two styles, both read here into the shape of
ComfyUI's ``/object_info`` (``{"input": {"required": {name: [type, options]}, "optional":
...}, "output": [...], "output_name": [...], "output_node": bool}``):

- V1: a class with an ``INPUT_TYPES`` classmethod returning a dict literal, ``RETURN_TYPES``
  / ``RETURN_NAMES`` / ``OUTPUT_NODE`` attributes (inherited within the file), registered
  in ``NODE_CLASS_MAPPINGS``;
- V3 (``comfy_api.latest``): ``define_schema`` returning ``io.Schema(node_id=..., inputs=[
  io.Int.Input("width", default=..., ...)], outputs=[io.Latent.Output()])``; keyword
  names become the keys ComfyUI's ``as_dict`` writes (``dynamic_prompts`` ->
  ``dynamicPrompts``, ...).

Values are evaluated from literals, module constants, constants of other stored files
(``nodes.MAX_RESOLUTION``) and Enum members (``[m.name for m in AttnType]``). Anything
that needs the running program (``folder_paths.get_filename_list("loras")``,
``comfy.samplers.KSampler.SAMPLERS``) becomes :class:`Dynamic` with its source text.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Dynamic:
    """A value only the running program knows (a file list, a list from an unstored module)."""

    source: str


@dataclass(frozen=True)
class EnumClass:
    members: tuple[tuple[str, Any], ...]  # (name, value) in definition order


BUILTINS = {"list": list, "tuple": tuple, "float": float, "int": int, "sorted": sorted}

# comfy_api.latest io classes -> their io_type (ComfyUI's @comfytype(io_type=...))
V3_TYPES = {
    "Boolean": "BOOLEAN",
    "Int": "INT",
    "Float": "FLOAT",
    "String": "STRING",
    "Combo": "COMBO",
    "Image": "IMAGE",
    "Mask": "MASK",
    "Latent": "LATENT",
    "Conditioning": "CONDITIONING",
    "Clip": "CLIP",
    "Vae": "VAE",
    "Model": "MODEL",
    "Audio": "AUDIO",
    "Video": "VIDEO",
    "ClipVision": "CLIP_VISION",
    "ModelPatch": "MODEL_PATCH",
    "Sampler": "SAMPLER",
    "Sigmas": "SIGMAS",
    "Noise": "NOISE",
    "Guider": "GUIDER",
}
# V3 keyword -> the key ComfyUI's Input.as_dict() writes into /object_info
V3_KEYS = {
    "force_input": "forceInput",
    "dynamic_prompts": "dynamicPrompts",
    "display_mode": "display",
    "widget_type": "widgetType",
}


class ModuleConstants:
    """Top-level constants and Enum classes of one source file, evaluated lazily."""

    def __init__(self, source: str, imports: Mapping[str, ModuleConstants] | None = None) -> None:
        self.tree = ast.parse(source)
        self.imports = dict(imports or {})  # module name -> its constants
        self.assigned: dict[str, ast.expr] = {}
        self.enums: dict[str, EnumClass] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        self.aliases: dict[str, tuple[str, str | None]] = {}  # local name -> (module, attribute or None)
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.assigned[node.targets[0].id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                self.assigned[node.target.id] = node.value
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
                if any(_name(base) in ("Enum", "enum.Enum", "StrEnum", "IntEnum") for base in node.bases):
                    self.enums[node.name] = EnumClass(
                        tuple(
                            (stmt.targets[0].id, self.value(stmt.value))
                            for stmt in node.body
                            if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name)
                        )
                    )
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    self.aliases[alias.asname or alias.name.split(".")[0]] = (alias.name, None)
            elif isinstance(node, ast.ImportFrom):  # relative imports keyed as ".module"
                module = "." * node.level + (node.module or "")
                for alias in node.names:
                    self.aliases[alias.asname or alias.name] = (module, alias.name)

    def value(self, node: ast.expr, local: Mapping[str, Any] | None = None) -> Any:
        """The value of an expression, or :class:`Dynamic` when it needs the running program."""
        local = local or {}
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [self.value(e, local) for e in node.elts]
            return items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.Dict):
            out: dict[Any, Any] = {}
            for key, item in zip(node.keys, node.values, strict=True):
                value = self.value(item, local)
                if key is None:  # {**spread}
                    if not isinstance(value, dict):
                        return Dynamic(ast.unparse(node))
                    out.update(value)
                else:
                    out[self.value(key, local)] = value
            return out
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = self.value(node.operand, local)
            return -inner if isinstance(inner, (int, float)) else Dynamic(ast.unparse(node))
        if isinstance(node, ast.BinOp):
            left, right = self.value(node.left, local), self.value(node.right, local)
            if isinstance(left, Dynamic) or isinstance(right, Dynamic):
                return Dynamic(ast.unparse(node))
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Mult):
                return left * right
        if isinstance(node, ast.Name):
            if node.id in local:
                return local[node.id]
            return self.name(node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = self.aliases.get(node.value.id)
            if module and module[1] is None and module[0] in self.imports:
                return self.imports[module[0]].name(node.attr)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in BUILTINS
            and len(node.args) == 1
            and not node.keywords
        ):
            arg = self.value(node.args[0], local)
            if not isinstance(arg, Dynamic) and not (
                isinstance(arg, (list, tuple)) and any(isinstance(a, Dynamic) for a in arg)
            ):
                return BUILTINS[node.func.id](arg)
        if isinstance(node, ast.ListComp) and len(node.generators) == 1:
            gen = node.generators[0]
            source = self.value(gen.iter, local)
            if (
                isinstance(source, EnumClass)
                and not gen.ifs
                and isinstance(gen.target, ast.Name)
                and isinstance(node.elt, ast.Attribute)
                and isinstance(node.elt.value, ast.Name)
                and node.elt.value.id == gen.target.id
                and node.elt.attr in ("name", "value")
            ):
                return [name if node.elt.attr == "name" else value for name, value in source.members]
        return Dynamic(ast.unparse(node))

    def name(self, name: str) -> Any:
        if name in self.enums:
            return self.enums[name]
        if name in self.assigned:
            return self.value(self.assigned[name])
        imported = self.aliases.get(name)
        if imported and imported[1] is not None and imported[0] in self.imports:
            return self.imports[imported[0]].name(imported[1])
        return Dynamic(name)


def _name(node: ast.expr) -> str:
    return ast.unparse(node)


def _class_attr(module: ModuleConstants, cls: ast.ClassDef, attr: str) -> ast.expr | None:
    """A class attribute's expression, looked up through base classes defined in the same file."""
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in stmt.targets):
            return stmt.value
    for base in cls.bases:
        parent = module.classes.get(_name(base))
        if parent is not None:
            found = _class_attr(module, parent, attr)
            if found is not None:
                return found
    return None


def _method(module: ModuleConstants, cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == name:
            return stmt
    for base in cls.bases:
        parent = module.classes.get(_name(base))
        if parent is not None:
            found = _method(module, parent, name)
            if found is not None:
                return found
    return None


def _returned(module: ModuleConstants, func: ast.FunctionDef) -> Any:
    """The value a function returns, with its simple local assignments evaluated first."""
    local: dict[str, Any] = {}
    for stmt in func.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            local[stmt.targets[0].id] = module.value(stmt.value, local)
        elif isinstance(stmt, ast.Return) and stmt.value is not None:
            return stmt.value if isinstance(stmt.value, ast.Call) else module.value(stmt.value, local)
    raise ValueError(f"{func.name} has no return statement")


def _v1_spec(spec: Any) -> list[Any]:
    """An INPUT_TYPES entry ``(type_or_options, {opts})`` in /object_info's list form."""
    items = list(spec) if isinstance(spec, (tuple, list)) else [spec]
    return [items[0], *items[1:2]] if len(items) > 1 else [items[0]]


def _v1_node(module: ModuleConstants, cls: ast.ClassDef) -> dict[str, Any]:
    func = _method(module, cls, "INPUT_TYPES")
    if func is None:
        raise ValueError(f"class {cls.name} has no INPUT_TYPES")
    types = _returned(module, func)
    if not isinstance(types, dict) or not all(isinstance(v, dict) for v in types.values()):
        raise ValueError(f"{cls.name}.INPUT_TYPES is built at run time ({types}), not readable statically")
    inputs = {
        section: {name: _v1_spec(spec) for name, spec in (types.get(section) or {}).items()}
        for section in ("required", "optional")
        if types.get(section)
    }
    outputs = _class_attr(module, cls, "RETURN_TYPES")
    names = _class_attr(module, cls, "RETURN_NAMES")
    output_node = _class_attr(module, cls, "OUTPUT_NODE")
    output = list(module.value(outputs)) if outputs is not None else []
    return {
        "input": inputs,
        "output": output,
        "output_name": list(module.value(names)) if names is not None else list(output),
        "output_node": bool(module.value(output_node)) if output_node is not None else False,
    }


def _v3_io(call: ast.Call) -> tuple[str, str]:
    """(io class name, "Input"/"Output") of ``io.Int.Input(...)``."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute)):
        raise ValueError(f"not an io.X.Input/Output call: {ast.unparse(call)[:80]}")
    return func.value.attr, func.attr


def _v3_input(module: ModuleConstants, call: ast.Call) -> tuple[str, str, list[Any]]:
    kind, _ = _v3_io(call)
    io_type = V3_TYPES.get(kind, f"?{kind}")
    args = [module.value(a) for a in call.args]
    name = args[0]
    opts: dict[str, Any] = {}
    if kind == "Combo" and len(args) > 1:
        opts["options"] = args[1]
    optional = False
    for kw in call.keywords:
        value = module.value(kw.value)
        if kw.arg == "optional":
            optional = bool(value)
        elif kw.arg == "upload":
            opts[f"{_name(kw.value).rsplit('.', 1)[-1]}_upload"] = True
        elif kw.arg is not None and value is not None:
            opts[V3_KEYS.get(kw.arg, kw.arg)] = value
    return ("optional" if optional else "required"), name, [io_type, opts] if opts else [io_type]


def _v3_node(module: ModuleConstants, schema: ast.Call) -> tuple[str, dict[str, Any]]:
    kwargs = {kw.arg: kw.value for kw in schema.keywords if kw.arg}
    node_id = module.value(kwargs["node_id"])
    inputs: dict[str, dict[str, Any]] = {}
    for call in getattr(kwargs.get("inputs"), "elts", []):
        section, name, spec = _v3_input(module, call)
        inputs.setdefault(section, {})[name] = spec
    output: list[str] = []
    output_name: list[str] = []
    for call in getattr(kwargs.get("outputs"), "elts", []):
        kind, _ = _v3_io(call)
        io_type = V3_TYPES.get(kind, f"?{kind}")
        display = next((module.value(kw.value) for kw in call.keywords if kw.arg == "display_name"), None)
        output.append(io_type)
        output_name.append(display or io_type)
    is_output = kwargs.get("is_output_node")
    description = kwargs.get("description")
    return node_id, {
        "description": module.value(description) if description is not None else "",
        "input": inputs,
        "output": output,
        "output_name": output_name,
        "output_node": bool(module.value(is_output)) if is_output is not None else False,
    }


def node_schemas(module: ModuleConstants, wanted: set[str]) -> dict[str, dict[str, Any]]:
    """The ``wanted`` nodes a source file defines, V1 (via NODE_CLASS_MAPPINGS) or V3 (via define_schema).

    A node that cannot be read statically (its INPUT_TYPES built by code) raises ValueError.
    """
    found: dict[str, dict[str, Any]] = {}
    mappings = module.assigned.get("NODE_CLASS_MAPPINGS")
    if isinstance(mappings, ast.Dict):
        for key, value in zip(mappings.keys, mappings.values, strict=True):
            if isinstance(key, ast.Constant) and key.value in wanted and isinstance(value, ast.Name):
                found[key.value] = _v1_node(module, module.classes[value.id])
    for cls in module.classes.values():
        define = _method(module, cls, "define_schema")
        if define is None:
            continue
        schema = _returned(module, define)
        if isinstance(schema, ast.Call) and _name(schema.func).endswith("Schema"):
            ids = [kw.value for kw in schema.keywords if kw.arg == "node_id"]
            if ids and module.value(ids[0]) in wanted:
                node_id, info = _v3_node(module, schema)
                found[node_id] = info
    return found


# --------------------------------------------------------------------------- comparison
FLAGS_FALSE_IS_ABSENT = {"multiline", "advanced", "dynamicPrompts", "forceInput", "socketless", "lazy"}
FLAGS_FALSE_IS_ABSENT |= {"control_after_generate", "image_upload", "optional", "multiselect"}
NOT_COMPARED = {"tooltip"}  # documentation text, not schema: it changes with every wording fix


@dataclass(frozen=True)
class Input:
    """One input, normalised: its type, combo options (or Dynamic) and the other options."""

    type: str
    options: tuple[Any, ...] | Dynamic | None
    attrs: tuple[tuple[str, Any], ...]

    def describe(self) -> str:
        extra = ", ".join(f"{k}={v!r}" for k, v in self.attrs)
        return f"{self.type}{' ' + extra if extra else ''}"


def normalise(spec: Any) -> Input:
    head = spec[0]
    opts = dict(spec[1]) if len(spec) > 1 and isinstance(spec[1], dict) else {}
    options: tuple[Any, ...] | Dynamic | None = None
    if isinstance(head, (list, tuple)):
        kind, options = "COMBO", tuple(head)
    elif isinstance(head, Dynamic):
        kind, options = "COMBO", head
    elif head == "COMBO":
        kind = "COMBO"
        raw = opts.pop("options", None)
        options = raw if isinstance(raw, Dynamic) else tuple(raw or ())
    else:
        kind = str(head)
    attrs = {
        k: v
        for k, v in opts.items()
        if k not in NOT_COMPARED and not (k in FLAGS_FALSE_IS_ABSENT and v is False) and k != "options"
    }
    return Input(kind, options, tuple(sorted(attrs.items())))


def compare(node: str, transcribed: Mapping[str, Any], upstream: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(problems, inputs whose options only the running program knows) of one node."""
    problems: list[str] = []
    dynamic: list[str] = []
    for section in ("required", "optional"):
        ours = (transcribed.get("input") or {}).get(section) or {}
        theirs = (upstream.get("input") or {}).get(section) or {}
        for name in sorted(set(theirs) - set(ours)):
            problems.append(f"{node}: {section} input {name!r} ({normalise(theirs[name]).describe()}) is missing")
        for name in sorted(set(ours) - set(theirs)):
            problems.append(f"{node}: {section} input {name!r} is not in upstream")
        for name in sorted(set(ours) & set(theirs)):
            a, b = normalise(ours[name]), normalise(theirs[name])
            if a.type != b.type:
                problems.append(f"{node}.{name}: type {a.type}, upstream {b.type}")
            if isinstance(b.options, Dynamic):
                dynamic.append(f"{node}.{name}: {b.options.source}")
                if a.type != "COMBO":
                    problems.append(f"{node}.{name}: upstream is a combo ({b.options.source})")
            elif a.options != b.options:
                problems.append(f"{node}.{name}: options {a.options}, upstream {b.options}")
            if a.attrs != b.attrs:
                problems.append(f"{node}.{name}: {dict(a.attrs)}, upstream {dict(b.attrs)}")
    for key in ("output", "output_name", "output_node"):
        if transcribed.get(key, [] if key != "output_node" else False) != upstream[key]:
            problems.append(f"{node}: {key} {transcribed.get(key)!r}, upstream {upstream[key]!r}")
    return problems, dynamic
