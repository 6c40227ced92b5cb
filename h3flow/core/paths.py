"""Where h3flow's own files are: the checkout and the folders beside the package.

h3flow runs from a source checkout (the workers' deployments point at it, and the
patches, templates and node pack travel from it), so these are resolved once, here.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]
SOURCE_DIR = PACKAGE_DIR.parent  # the checkout: prefect.yaml, workflows/, patches/, comfy_nodes/
DATA_DIR = PACKAGE_DIR / "data"
WORKFLOWS_DIR = SOURCE_DIR / "workflows"
PATCHES_DIR = SOURCE_DIR / "patches"
NODE_PACK_DIR = SOURCE_DIR / "comfy_nodes" / "h3flow_nodes"
EXAMPLES_DIR = SOURCE_DIR / "examples"

# each flow's entrypoint, relative to the checkout (what deployments and prefect.yaml name,
# and what preflight looks for on every host)
ENTRYPOINTS = {
    "sample-clip": "h3flow/pipeline/flows/clip.py:sample_clip",
    "decode-clip": "h3flow/pipeline/flows/clip.py:decode_clip",
    "batch": "h3flow/pipeline/flows/batch.py:batch",
}
