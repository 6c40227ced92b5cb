"""What a newcomer does after ``make demo``: the commands it prints, and the Prefect UI in a real browser.

The demo runs as ``make demo`` runs it — ``.venv/bin/h3flow demo --keep`` from a
checkout, in a real terminal of 80 columns, with h3flow *not* on PATH — and its
closing lines must be commands that work exactly as printed (UI, status, the MP4s,
logs) and fit those 80 columns.

Debian's Chromium (``apt-get install chromium``, scripts/install-system-deps.sh) driven
by Playwright (a dev dependency in pyproject.toml) loads the page ``h3flow open``
prints and the runs page: they must show the batch run and its clips, and never say
"Can't connect to Server API" (the UI once asked Prefect's default port 4200 instead of
the server it was served by). Screenshots are saved in the test's tmp dir
(``runs.png``, ``batch-run.png``, ``subflows.png``).
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
from pseudo_terminal import Screen, run_in_terminal

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
CLOSING = "Look at what it made (the services keep running):"


def browser_unavailable() -> str | None:
    if not Path(CHROMIUM).is_file():
        return f"{CHROMIUM} not found: install Debian's chromium (scripts/install-system-deps.sh)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed: pip install -e '.[dev]'"
    return None


def needs_browser() -> None:
    reason = browser_unavailable()
    if reason:
        pytest.skip(reason)


@dataclass
class Demo:
    checkout: Path  # where the demo ran, as from a checkout: .venv is there
    config_path: Path
    run_id: str
    clips: list[str]
    shots: Path
    screen: Screen

    @property
    def config(self) -> LocalConfig:
        return load_local_config(self.config_path)

    @property
    def ui(self) -> str:
        return self.config.prefect.api_url.removesuffix("/api")


def newcomers_env() -> dict[str, str]:
    """A shell where h3flow is not on PATH (the venv not activated) and no PREFECT_* is set."""
    venv_bin = str(Path(sys.prefix) / "bin")
    path = ":".join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(":") if p and p != venv_bin)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "H3FLOW_")) and k != "VIRTUAL_ENV"}
    return {**env, "PATH": path}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    tmp = tmp_path_factory.mktemp("ui")
    checkout = tmp / "checkout"
    checkout.mkdir()
    (checkout / ".venv").symlink_to(sys.prefix)  # `make demo` runs .venv/bin/h3flow from the checkout
    clips = ["lake", "lake-night"]  # ids that share a prefix: both must show in full
    write_batch(checkout / "ui.json", [{"id": c, "seed": i} for i, c in enumerate(clips)])
    argv = [
        ".venv/bin/h3flow",
        "demo",
        "--keep",
        "--batch",
        "ui.json",
        "--base-port",
        str(random.randint(30000, 50000)),
    ]
    config_path = checkout / ".h3flow" / "local.json"
    try:
        screen = run_in_terminal(argv, cwd=checkout, env=newcomers_env(), columns=80, timeout=900)
        assert screen.returncode == 0, screen.text[-3000:]
        run_id = next(line.split(": ", 1)[1].strip() for line in screen.lines if line.startswith("run id:"))
        yield Demo(checkout, config_path, run_id, clips, tmp, screen)
    finally:
        if config_path.exists():
            subprocess.run([H3FLOW, "stop", "--local", "--config", str(config_path)], capture_output=True, timeout=300)


def closing_block(demo: Demo) -> list[str]:
    lines = demo.screen.lines
    start = lines.index(CLOSING)
    return [line for line in lines[start:] if line.strip()]


def test_the_demo_ends_with_commands_that_work_as_printed_at_80_columns(demo: Demo) -> None:
    run = demo.run_id
    block = closing_block(demo)
    assert block == [
        CLOSING,
        f"  UI      .venv/bin/h3flow open {run}",
        f"  status  .venv/bin/h3flow status {run}",
        f"  MP4s    ls .h3flow/store/host-b/outputs/{run}",
        f"  logs    .venv/bin/h3flow logs {run}",
        "  stop    .venv/bin/h3flow stop --local",
        "`source .venv/bin/activate` puts h3flow on your PATH",
    ]
    paths = ("videos:", "gantt:", "report:", "manifest:", "outputs:", "logs:")
    wide = demo.screen.wider_than(80)
    assert [line for line in wide if not line.startswith(paths)] == []  # only lines of one whole path go past 80
    table_or_path = [line for line in demo.screen.lines if "│" in line or line.startswith(paths)]
    assert table_or_path and not [line for line in table_or_path + block if "…" in line]  # nothing cut short
    ui_line = next(line for line in demo.screen.lines if line.startswith("Prefect UI: "))
    assert httpx.get(ui_line.removeprefix("Prefect UI: "), timeout=10).status_code == 200  # a live link

    def typed(line: str) -> subprocess.CompletedProcess[str]:
        command = line.split(None, 1)[1]
        return subprocess.run(
            ["bash", "-c", command], cwd=demo.checkout, env=newcomers_env(), capture_output=True, text=True, timeout=120
        )

    opened = typed(block[1])
    assert opened.returncode == 0, opened.stderr
    assert opened.stdout == f"{demo.ui}/runs/flow-run/{batch_flow_run_id(demo)}\n"  # the batch run's page
    # (the page itself is the browser test's: the UI's server answers a deep link with its app and a 404)
    status = typed(block[2])
    assert status.returncode == 0, status.stderr
    assert f"run {run} — completed" in status.stdout and all(clip in status.stdout for clip in demo.clips)
    listed = typed(block[3])
    assert listed.returncode == 0 and sorted(listed.stdout.split()) == sorted(f"{clip}.mp4" for clip in demo.clips)
    logs = typed(block[4])
    assert logs.returncode == 0, logs.stderr
    assert f"{run}: Beginning flow run '{run}' for flow 'batch'" in logs.stdout
    assert all("Warning" not in r.stderr and "Traceback" not in r.stderr for r in (opened, status, listed, logs))


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


def test_the_runs_page_and_the_page_h3flow_open_prints_in_a_real_browser(demo: Demo) -> None:
    needs_browser()
    from playwright.sync_api import sync_playwright

    opened = subprocess.run(
        [H3FLOW, "open", demo.run_id, "--no-browser", "-c", str(demo.config_path)],
        capture_output=True, text=True, env=newcomers_env(), timeout=120,
    )  # fmt: skip
    assert opened.returncode == 0, opened.stderr
    (page_url,) = opened.stdout.split()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(f"{demo.ui}/runs", wait_until="networkidle")
            page.get_by_text(demo.run_id, exact=True).first.wait_for(timeout=60_000)
            page.screenshot(path=str(demo.shots / "runs.png"), full_page=True)
            assert CANT_CONNECT not in page.content()

            page.goto(page_url, wait_until="networkidle")
            page.get_by_text(demo.run_id).first.wait_for(timeout=60_000)
            page.screenshot(path=str(demo.shots / "batch-run.png"), full_page=True)
            assert CANT_CONNECT not in page.content()
            assert "Completed" in page.inner_text("body")

            page.get_by_text("Subflow Runs", exact=True).first.click()
            page.wait_for_load_state("networkidle")
            page.screenshot(path=str(demo.shots / "subflows.png"), full_page=True)
            body = page.inner_text("body")
        finally:
            browser.close()
    assert all((demo.shots / shot).stat().st_size > 10_000 for shot in ("runs.png", "batch-run.png", "subflows.png"))
    # each clip's runs are subflow runs of the batch run, named so the UI shows them whole
    # ("lake-pan-left sample on a0"; the "·" of the old names was dropped by the UI's timeline)
    for clip in demo.clips:
        assert f"{clip} sample on a" in body and f"{clip} decode on b" in body, (clip, body[:2000])


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
