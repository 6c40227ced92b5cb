"""``h3flow demo``: the embedded default end to end on this machine.

config-adapt --local → start --local (Prefect server, workers, receiver) → run the
example batch (6 clips, reference model) → wait with a progress bar → say where the
MP4s, the Gantt chart and the report are → stop (unless ``--keep``).

``--engine comfy`` runs every stage in real local ComfyUI servers, one per pool
(installed once, cached), in a work dir of its own (``.h3flow-comfy``).
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from h3flow.deployments import SOURCE_DIR
from h3flow.errors import ConfigError

DEMO_BATCH = SOURCE_DIR / "examples" / "batches" / "demo.json"
console = Console(highlight=False)


def default_workdir(engine: str) -> Path:
    """Each engine has its own work dir, so the two demos' services and caches never mix."""
    return Path(".h3flow") if engine == "local" else Path(f".h3flow-{engine}")


def ensure_local_config(workdir: Path, base_port: int, engine: str = "local") -> Path:
    """Reuse the work dir's local.json while its services may be running; else write a fresh one."""
    from h3flow.adapt import adapt, local_host_map
    from h3flow.config import load_local_config
    from h3flow.config_cli import ENGINES, render
    from h3flow.fsutil import atomic_write_json

    if engine not in ENGINES:
        raise ConfigError(f"--engine {engine!r}: choose one of {', '.join(ENGINES)}")
    path = workdir / "local.json"
    if not path.exists():
        workdir.mkdir(parents=True, exist_ok=True)
        hm = local_host_map(workdir, base_port, engine=engine)  # type: ignore[arg-type]
        atomic_write_json(path, render(adapt(hm, work_dir=str(workdir.resolve()))))
    elif (have := load_local_config(path).engine) != engine:
        raise ConfigError(f"{path} runs engine {have!r}, not {engine!r}: give another --workdir")
    return path


def run_demo(workdir: Path, keep: bool, base_port: int, batch: Path = DEMO_BATCH, *, engine: str = "local") -> int:
    from h3flow.config import load_local_config
    from h3flow.ops.lifecycle import start_services, stop_services
    from h3flow.runs_cli import finish, print_status, start_run, wait

    if not batch.exists():
        raise ConfigError(f"demo batch {batch} is missing")
    config_path = ensure_local_config(workdir, base_port, engine)
    config = load_local_config(config_path)
    t0 = time.monotonic()
    start_services(config, config_path, console=console)
    try:
        manifest = start_run(batch, config_path)
        console.print(f"run id: [bold]{manifest.run_id}[/]")
        manifest = wait(manifest.run_id, config_path, timeout=900)
        print_status(manifest)
        code = finish(manifest)
        run_dir = Path(config.runs_dir) / manifest.run_id
        outputs = sorted({str(Path(c.output).parent) for c in manifest.clips.values() if c.output})
        console.print(f"videos:   {', '.join(outputs) or '—'}")
        for name, what in (("gantt.png", "gantt:   "), ("report.md", "report:  "), ("manifest.json", "manifest:")):
            if (run_dir / name).exists():
                console.print(f"{what} {run_dir / name}")
        console.print(f"Prefect UI: {config.prefect.api_url.removesuffix('/api')}")
        if config.engine == "comfy":
            console.print("ComfyUI:  " + ", ".join(f"{p.comfy_url} ({p.name})" for p in config.pools))
        console.print(f"demo took {time.monotonic() - t0:.0f} s")
        return code
    finally:
        if not keep:
            stop_services(config, config_path, console=console)
        else:
            console.print(f"services left running (--keep): stop them with `h3flow stop --local --config {config_path}`")
