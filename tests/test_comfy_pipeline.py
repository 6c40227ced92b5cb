"""The Prefect pipeline through real ComfyUI servers: ``engine: comfy`` on the embedded default.

``config-adapt --local --engine comfy`` gives one ComfyUI per pool (0.33.0 from
``../shared/upstream``, CPU torch, installed once into ``${H3FLOW_CACHE:-~/.cache/h3flow}/comfyui-783545f6``
— about 3.5 minutes the first time; skipped, saying so, without that archive or
``$H3FLOW_COMFYUI_SOURCE``), which ``start --local`` starts beside the Prefect
server, before the workers. A small batch then runs end to end: the real workers run
the flows, and every encode / sample / decode is a reference workflow executed by the
pool's ComfyUI, checked against each server's ``/history``.

The first tests need no server: the services and the config that engine makes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import httpx
import pytest
from cluster import ROOT, Cluster, make_cluster, write_batch
from typer.testing import CliRunner
from upstream import require_comfyui_source

from h3flow.cli import app
from h3flow.config.models import load_local_config
from h3flow.core.errors import ConfigError
from h3flow.core.fsutil import sha256_file
from h3flow.ops.comfy_install import default_install
from h3flow.ops.services import HttpHealth, local_specs
from h3flow.pipeline.manifest import load_manifest

H3FLOW = str(Path(sys.prefix) / "bin" / "h3flow")
runner = CliRunner()


# --------------------------------------------------------------------------- no server needed
def test_config_adapt_local_engine_comfy_gives_one_comfyui_per_pool_before_the_workers(tmp_path: Path) -> None:
    out = tmp_path / "local.json"
    res = runner.invoke(
        app, ["config-adapt", "--local", "--engine", "comfy", "--workdir", str(tmp_path / "wd"), "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    config = load_local_config(out)
    assert config.engine == "comfy" and config.model.kind == "reference"
    specs = local_specs(config, out)
    assert [s.kind for s in specs][:4] == ["prefect-server", "comfyui", "comfyui", "comfyui"]
    comfy = {s.name: s for s in specs if s.kind == "comfyui"}
    assert set(comfy) == {f"comfyui-{p.name}" for p in config.pools} == {"comfyui-a0", "comfyui-a1", "comfyui-b"}
    install = default_install()
    ports = set()
    for pool in config.pools:
        spec = comfy[f"comfyui-{pool.name}"]
        base = tmp_path / "wd" / "comfyui" / pool.name
        assert spec.host == pool.host and spec.binds == (("127.0.0.1", pool.comfy_port),)
        assert spec.argv[:3] == (str(install.python), str(install.launcher), str(install.tree))
        args = list(spec.argv[3:])
        assert args[args.index("--port") + 1] == str(pool.comfy_port) and "--cpu" in args
        assert args[args.index("--listen") + 1] == "127.0.0.1"
        assert Path(args[args.index("--base-directory") + 1]) == base.resolve()
        assert spec.health == HttpHealth(f"{pool.comfy_url}/system_stats", expect=None)
        assert spec.env["CUDA_VISIBLE_DEVICES"] == pool.env["CUDA_VISIBLE_DEVICES"]
        assert not any(k.startswith("PREFECT_") for k in spec.env)
        ports.add(pool.comfy_port)
    assert len(ports) == 3 and int(config.prefect.api_url.rsplit(":", 1)[1].split("/")[0]) not in ports


def test_engine_local_starts_no_comfyui_and_bad_engine_choices_fail_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "local.json"
    assert (
        runner.invoke(app, ["config-adapt", "--local", "--workdir", str(tmp_path / "wd"), "-o", str(out)]).exit_code
        == 0
    )
    config = load_local_config(out)
    assert config.engine == "local" and not [s for s in local_specs(config, out) if s.kind == "comfyui"]
    bad = runner.invoke(app, ["config-adapt", "--local", "--engine", "gpu", "-o", str(tmp_path / "x.json")])
    assert bad.exit_code == 2 and bad.output.strip() == "error: --engine 'gpu': choose one of local, comfy"
    host_map = runner.invoke(app, ["config-adapt", str(ROOT / "examples" / "host-map.example.json"), "--engine", "comfy",
                                   "-o", str(tmp_path / "y.json")])  # fmt: skip
    assert host_map.exit_code == 2 and "--engine goes with --local" in host_map.output
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "y.json").exists()


def test_the_demo_keeps_each_engines_work_dir_apart(tmp_path: Path) -> None:
    from h3flow.cli.demo import default_workdir, ensure_local_config

    assert (default_workdir("local"), default_workdir("comfy")) == (Path(".h3flow"), Path(".h3flow-comfy"))
    path = ensure_local_config(tmp_path, 14200, "comfy")
    assert load_local_config(path).engine == "comfy"
    assert ensure_local_config(tmp_path, 14200, "comfy") == path  # reused while its services may run
    with pytest.raises(ConfigError, match="runs engine 'comfy', not 'local'"):
        ensure_local_config(tmp_path, 14200, "local")


# --------------------------------------------------------------------------- real ComfyUI + Prefect
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    require_comfyui_source()
    c = make_cluster(tmp_path_factory.mktemp("comfy-pipeline"), engine="comfy")
    try:
        c.start()  # installs ComfyUI if not cached, then ComfyUI ×3 beside Prefect, then workers, receiver
    except BaseException:
        c.stop()  # what did start must not outlive a failed start
        raise
    yield c
    c.stop()


def h3(cluster: Cluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **cluster.env(), "COLUMNS": "200"}
    return subprocess.run(
        [H3FLOW, *args, "--config", str(cluster.config_path)], capture_output=True, text=True, env=env, timeout=timeout
    )


def history(url: str) -> list[dict[str, Any]]:
    """What one ComfyUI executed: per prompt, its node types and the files its save nodes reported."""
    entries = httpx.get(f"{url}/history", timeout=10).json().values()
    return [
        {
            "types": {node["class_type"] for node in entry["prompt"][2].values()},
            "status": entry["status"]["status_str"],
            "files": {f["kind"]: f["sha256"] for out in entry["outputs"].values() for f in out.get("h3flow_files", [])},
        }
        for entry in entries
    ]


@pytest.mark.comfy
@pytest.mark.prefect
def test_a_batch_runs_through_real_workers_and_real_comfyui_servers(cluster: Cluster, tmp_path: Path) -> None:
    from h3flow.ops.lifecycle import service_status

    config = cluster.config
    comfy = [s for s in service_status(config, cluster.config_path) if s.spec.kind == "comfyui"]
    assert [(s.spec.name, s.proc.running, s.healthy) for s in comfy] == [
        ("comfyui-a0", True, True), ("comfyui-a1", True, True), ("comfyui-b", True, True),
    ]  # fmt: skip

    images = ROOT / "examples" / "images"
    batch = write_batch(tmp_path / "two.json", [
        {"id": "lake", "seed": 1, "prompt": "slow pan left over a calm lake"},
        {"id": "shapes", "seed": 2, "prompt": "fast zoom in on the shapes", "image": str(images / "shapes.png")},
    ])  # fmt: skip
    res = h3(cluster, "run", str(batch), "--background")
    assert res.returncode == 0, res.stderr + res.stdout
    run_id = res.stdout.strip().splitlines()[-1]
    res = h3(cluster, "wait", run_id)
    assert res.returncode == 0, res.stdout + res.stderr
    manifest = load_manifest(config.runs_dir, run_id)
    assert manifest.state == "completed" and sorted(rec.clip.id for rec in manifest.delivered) == ["lake", "shapes"]

    ran = {pool.name: history(pool.comfy_url) for pool in config.pools}
    assert all(p["status"] == "success" for prompts in ran.values() for p in prompts)

    def reported(pool: str, node: str, kind: str) -> list[str]:
        return [p["files"][kind] for p in ran[pool] if node in p["types"]]

    for rec in manifest.clips.values():
        # the MP4: H.264 + AAC at the clip's size, length and rate, byte for byte what ComfyUI wrote
        with av.open(rec.output) as mp4:
            video, audio = mp4.streams.video[0], mp4.streams.audio[0]
            assert (video.codec_context.name, video.width, video.height) == ("h264", 224, 128)
            assert video.average_rate == Fraction(24) and video.frames == rec.clip.frames
            assert (audio.codec_context.name, audio.rate, audio.channels) == ("aac", 48000, 2)
        assert sha256_file(rec.output) == rec.output_sha256
        assert rec.output_sha256 in reported("b", "H3ReferenceDecode", "video")
        # encode and sample on the clip's sampler pool's ComfyUI, the latent handed off as written there
        assert rec.pool in ("a0", "a1") and rec.decoder == "b"
        assert rec.stages["encode"].sha256 in reported(rec.pool, "H3ReferenceEncode", "conditioning")
        assert rec.latent_sha256 == rec.stages["sample"].sha256
        assert rec.latent_sha256 in reported(rec.pool, "H3ReferenceSample", "latent")

    # every engine invocation was one ComfyUI prompt, each on the right server
    def count(node: str, pools: tuple[str, ...]) -> int:
        return sum(node in p["types"] for pool in pools for p in ran[pool])

    assert count("H3ReferenceEncode", ("a0", "a1")) == cluster.invocations("encode") == 2
    assert count("H3ReferenceSample", ("a0", "a1")) == cluster.invocations("sample") == 2
    assert count("H3ReferenceDecode", ("b",)) == cluster.invocations("decode") == 2
    assert count("H3ReferenceDecode", ("a0", "a1")) == 0
    assert count("H3ReferenceEncode", ("b",)) == count("H3ReferenceSample", ("b",)) == 0


def gone(pid: int) -> bool:
    """No such process, or a zombie (this test process spawned it and has not reaped it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.comfy
@pytest.mark.prefect
def test_stop_ends_every_comfyui(cluster: Cluster) -> None:
    """Stopping takes ComfyUI down with the rest (after the workers)."""
    config = cluster.config
    pids = {pool.name: cluster.pidfile_pid(f"comfyui-{pool.name}") for pool in config.pools}
    cluster.stop()
    for pool in config.pools:
        assert gone(pids[pool.name]), pool.name
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{pool.comfy_url}/system_stats", timeout=2)
    assert not list((cluster.workdir / "services").glob("comfyui-*.pid"))
