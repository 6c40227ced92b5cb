"""The node pack as a ComfyUI citizen, without a server (fast tier).

- it imports nothing outside ComfyUI's own environment (the standard library, torch,
  safetensors, numpy, av, PIL, psutil, and ComfyUI's modules): read from every source
  file with ``ast``, and checked again by importing the pack's modules in a fresh
  interpreter that must end up without h3flow, Prefect or their dependencies loaded;
- every node has a description and every input a tooltip (its V3 schemas, read with
  ``ast`` as tests/upstream_nodes.py reads upstream's: nodes.py imports comfy_api,
  which only a ComfyUI has);
- the schema transcription's entries for the pack are the pack's schemas;
- the UI-format workflows in example_workflows/ load: every node known, every widget
  value set (no placeholder, no NaN), every link typed as its ends.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from ui_workflow import VIRTUAL, to_api
from upstream_nodes import Dynamic, ModuleConstants, compare, node_schemas

from h3flow.core.paths import NODE_PACK_DIR
from h3flow.engines.workflows import upstream_object_info, validate_prompt

# What ComfyUI's own requirements.txt installs, plus ComfyUI's top-level modules.
COMFY_ENVIRONMENT = {"torch", "safetensors", "numpy", "av", "PIL", "psutil"}
COMFY_MODULES = {"comfy", "comfy_api", "comfy_execution", "folder_paths", "node_helpers", "server"}
# What installing h3flow would drag into ComfyUI's venv: none of it may be loaded.
FOREIGN = ("h3flow", "prefect", "pydantic", "httpx", "typer", "fabric", "rich", "matplotlib", "websockets")


def pack_sources() -> list[Path]:
    return sorted(p for p in NODE_PACK_DIR.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_pack_imports_only_what_comfyui_runs_on() -> None:
    allowed = set(sys.stdlib_module_names) | COMFY_ENVIRONMENT | COMFY_MODULES
    wrong = []
    for path in pack_sources():
        depth = len(path.relative_to(NODE_PACK_DIR).parts) - 1  # subpackage depth inside the pack
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    if node.level - 1 > depth:
                        wrong.append(f"{path.name}: relative import leaves the pack (level {node.level})")
                    continue
                tops = [(node.module or "").split(".")[0]]
            else:
                continue
            wrong += [f"{path.relative_to(NODE_PACK_DIR)}: import {top}" for top in tops if top not in allowed]
    assert wrong == []


def test_importing_the_pack_loads_no_h3flow_and_no_prefect() -> None:
    """Every module that runs without ComfyUI, imported in a fresh interpreter (h3flow *is* installed here)."""
    modules = [
        "h3flow_nodes." + ".".join(p.relative_to(NODE_PACK_DIR).with_suffix("").parts)
        for p in pack_sources()
        if p.name not in ("__init__.py", "nodes.py", "comfy_clip.py")  # those two need ComfyUI's comfy_api / comfy
    ]
    code = (
        "import sys, importlib\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print([m for m in sys.modules if m.split('.')[0] in {FOREIGN!r}])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip() == "[]"
    assert len(modules) >= 15  # codec, layout, files, errors, mux, common, multigpu, partition, reference/*


@pytest.fixture(scope="module")
def pack_schemas() -> dict[str, dict]:
    source = (NODE_PACK_DIR / "nodes.py").read_text(encoding="utf-8")
    module = ModuleConstants(source, {".layout": ModuleConstants((NODE_PACK_DIR / "layout.py").read_text())})
    ids = {
        kw.value.value
        for node in ast.walk(module.tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("Schema")
        for kw in node.keywords
        if kw.arg == "node_id" and isinstance(kw.value, ast.Constant)
    }
    return node_schemas(module, ids)


def test_every_node_has_a_description_and_every_input_a_tooltip(pack_schemas: dict[str, dict]) -> None:
    assert len(pack_schemas) == 9
    for name, schema in pack_schemas.items():
        assert len(schema["description"]) > 40, name
        for section in schema["input"].values():
            for key, spec in section.items():
                tip = spec[1].get("tooltip") if len(spec) > 1 else None
                assert isinstance(tip, str) and len(tip) > 10, f"{name}.{key} has no tooltip"


def test_the_reference_encoder_takes_an_image_and_saves_show_what_they_wrote(pack_schemas: dict[str, dict]) -> None:
    assert pack_schemas["H3ReferenceEncode"]["input"]["required"]["image"][0] == "IMAGE"
    outputs = {name for name, schema in pack_schemas.items() if schema["output_node"]}
    assert outputs == {"H3SaveConditioning", "H3LatentHandoffSave", "H3SaveVideoAAC"}
    source = (NODE_PACK_DIR / "nodes.py").read_text()
    assert "ui.PreviewVideo(" in source  # the video save node's UI output (checked live in test_comfy_server)


def test_schema_fixture_matches_the_node_pack(pack_schemas: dict[str, dict]) -> None:
    fixture = upstream_object_info()
    assert sorted(n for n in fixture if n.startswith("H3")) == sorted(pack_schemas)
    for name, schema in pack_schemas.items():
        problems, dynamic = compare(name, fixture[name], schema)
        assert problems == [], "\n".join(problems)
        assert dynamic == (
            ["H3MultiGPUCLIPLoader.clip_name: _text_encoder_files()"] if name.startswith("H3Multi") else []
        )
    clip_name = pack_schemas["H3MultiGPUCLIPLoader"]["input"]["required"]["clip_name"]
    assert isinstance(clip_name[1]["options"], Dynamic)  # the host's files, listed at run time


# --------------------------------------------------------------------------- example workflows (UI format)
EXAMPLES = NODE_PACK_DIR / "example_workflows"


def examples() -> list[Path]:
    return sorted(EXAMPLES.glob("*.json"))


def test_one_example_per_stage_and_one_for_the_whole_pipeline_written_by_the_script() -> None:
    assert [p.stem for p in examples()] == [
        "h3flow_1_reference_encode",
        "h3flow_2_reference_sample",
        "h3flow_3_reference_decode",
        "h3flow_4_reference_pipeline",
        "h3flow_5_minimax_h3_sample_handoff",
        "h3flow_6_minimax_h3_decode_handoff",
    ]
    done = subprocess.run(
        [sys.executable, str(NODE_PACK_DIR.parents[1] / "scripts" / "make_example_workflows.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "up to date"), done.stdout + done.stderr


@pytest.mark.parametrize("path", examples(), ids=lambda p: p.stem)
def test_example_workflow_loads_without_placeholders_or_nan(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert "{{" not in text and "NaN" not in text and "Infinity" not in text
    workflow = json.loads(text)
    assert {n["type"] for n in workflow["nodes"]} & VIRTUAL, "each example explains itself in a note"
    prompt, problems = to_api(workflow, upstream_object_info())  # notes are the editor's own: left out
    assert problems == []
    assert validate_prompt(prompt, upstream_object_info()) == []
    assert any(n["class_type"].startswith("H3") for n in prompt.values())


def test_the_checker_catches_what_shows_as_nan_in_the_editor() -> None:
    workflow = json.loads((EXAMPLES / "h3flow_2_reference_sample.json").read_text())
    sample = next(n for n in workflow["nodes"] if n["type"] == "H3ReferenceSample")
    sample["widgets_values"] = [11, 4]  # the seed's "control after generate" entry left out: steps would read "4" as it
    _, problems = to_api(workflow, upstream_object_info())
    assert "node 2 (H3ReferenceSample): 2 widget values for 3 widgets ['seed', None, 'steps']" in problems
    sample["widgets_values"] = [float("nan"), "fixed", 4]
    _, problems = to_api(workflow, upstream_object_info())
    assert "node 2 (H3ReferenceSample): widget seed is nan" in problems


# Standard-library names that Python 3.11+ added (ComfyUI supports 3.10; no 3.10 interpreter
# runs here, so the pack is checked statically): module -> names, "*" for a new module.
NEWER_THAN_310 = {
    "datetime": {"UTC"},
    "enum": {"StrEnum", "ReprEnum", "verify", "EnumCheck", "FlagBoundary", "global_enum", "member", "nonmember"},
    "typing": {"Self", "LiteralString", "Never", "assert_never", "assert_type", "reveal_type", "TypeVarTuple",
               "Unpack", "Required", "NotRequired", "dataclass_transform", "override", "TypeAliasType"},
    "hashlib": {"file_digest"},
    "asyncio": {"TaskGroup", "timeout", "Runner"},
    "contextlib": {"chdir"},
    "math": {"cbrt", "exp2"},
    "operator": {"call"},
    "itertools": {"batched"},
    "tomllib": {"*"},
    "wsgiref.types": {"*"},
}  # fmt: skip


def test_the_pack_runs_on_python_310() -> None:
    """Parsed with 3.10's grammar, and no 3.11+ standard-library name imported or used as module.attr."""
    wrong = []
    for path in pack_sources():
        source = path.read_text(encoding="utf-8")
        rel = path.relative_to(NODE_PACK_DIR)
        try:
            tree = ast.parse(source, feature_version=(3, 10))
        except SyntaxError as exc:
            wrong.append(f"{rel}:{exc.lineno}: not Python 3.10 syntax ({exc.msg})")
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module in NEWER_THAN_310:
                new = NEWER_THAN_310[node.module]
                wrong += [f"{rel}:{node.lineno}: from {node.module} import {a.name}" for a in node.names
                          if "*" in new or a.name in new]  # fmt: skip
            elif isinstance(node, ast.Import):
                wrong += [f"{rel}:{node.lineno}: import {a.name}" for a in node.names
                          if "*" in NEWER_THAN_310.get(a.name, ())]  # fmt: skip
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.attr in NEWER_THAN_310.get(node.value.id, ())
            ):
                wrong.append(f"{rel}:{node.lineno}: {node.value.id}.{node.attr}")
    assert wrong == []


def test_the_pack_ships_what_the_comfy_registry_and_manager_read() -> None:
    import tomllib

    meta = tomllib.loads((NODE_PACK_DIR / "pyproject.toml").read_text(encoding="utf-8"))
    project, comfy = meta["project"], meta["tool"]["comfy"]
    from h3flow_nodes import __version__

    assert project["name"] == "h3flow-nodes" and "comfyui" not in project["name"].lower()
    assert project["version"] == __version__ and project["requires-python"] == ">=3.10"
    assert project["license"] == {"file": "LICENSE"} and project["dependencies"] == []
    assert (NODE_PACK_DIR / "LICENSE").read_text().lstrip().startswith("Apache License\n")
    assert set(comfy) >= {"PublisherId", "DisplayName", "requires-comfyui"} and comfy["requires-comfyui"] == ">=0.3.75"
    # requirements.txt installs nothing: everything the pack imports is ComfyUI's own (checked above)
    lines = (NODE_PACK_DIR / "requirements.txt").read_text().splitlines()
    assert lines and all(not line.strip() or line.startswith("#") for line in lines)
