"""``h3flow preflight``: real facts from real hosts (this machine behind the test sshd).

This machine has no GPU, a CPU torch and no ComfyUI, so against a CPU / reference-model
local.json every check passes or is skipped (services not started yet), and against a
production one (T10s, MiniMax H3, ComfyUI) preflight must say exactly what is missing
and how to fix it. The checks after ``start`` (workers, the API from each host, link
probes) run in tests/test_multihost.py, where the hosts are network namespaces.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from remote_hosts import host_map, write_config
from sshd import SshServer
from test_patches import COMFY, RAYLIGHT, checkout

from h3flow.engines.workflows import upstream_object_info
from h3flow.ops.preflight import HostView, check_clock, check_comfyui, check_disk, check_gpus, fetch_object_info
from h3flow.ops.services import Proc, service_specs
from h3flow.ops.ssh import SSH_CONFIG_ENV

H3FLOW = str(Path(sys.prefix) / "bin" / "h3flow")


def preflight(path: Path, sshd: SshServer | None = None) -> tuple[int, dict[tuple[str, str], dict[str, Any]]]:
    """Run the real command; its checks keyed by (host, check)."""
    env = {**os.environ, "COLUMNS": "200", **({SSH_CONFIG_ENV: str(sshd.config)} if sshd else {})}
    done = subprocess.run(
        [H3FLOW, "preflight", "--json", "--config", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is (done.returncode == 0)
    return done.returncode, {(c["host"], c["name"]): c for c in report["checks"]}


def test_a_cpu_reference_cluster_over_ssh_is_ready_before_start(sshd: SshServer, tmp_path: Path) -> None:
    _, path = write_config(tmp_path, host_map(tmp_path, sshd.alias))
    code, checks = preflight(path, sshd)
    assert code == 0, [c for c in checks.values() if c["status"] == "fail"]
    assert all(c["status"] != "fail" and (c["status"] == "ok" or c["detail"]) for c in checks.values())
    for host in ("host-a", "host-b"):
        assert checks[host, "ssh"]["status"] == "ok" and "host key matches known_hosts" in checks[host, "ssh"]["detail"]
        assert checks[host, "venv"]["detail"].startswith(f"python {sys.version.split()[0]}, h3flow 0.1.0")
        assert "torch 2.13.0" in checks[host, "torch"]["detail"] and "cpu build" in checks[host, "torch"]["detail"]
        assert checks[host, "gpus"]["status"] == "ok" and checks[host, "gpus"]["detail"].startswith(
            "cpu (reference model)"
        )
        assert checks[host, "disk"]["status"] == "ok" and "GiB free" in checks[host, "disk"]["detail"]
        assert checks[host, "clock"]["status"] == "ok"
        assert checks[host, "comfyui"]["detail"] == "engine local: the stages run in the workers, no ComfyUI"
        assert checks[host, "models"]["detail"] == "the reference model has no weight files"
        assert (
            checks[host, "prefect api"]["status"] == "skip"
            and "not started yet" in checks[host, "prefect api"]["detail"]
        )
    assert checks["host-a", "retain"] == {
        "host": "host-a",
        "name": "retain",
        "status": "ok",
        "fix": "",
        "detail": "H3_MP_RETAIN_CPU_WEIGHTS=1 in the environment `h3flow start` gives worker-h3-a0",
    }
    assert checks["host-b", "retain"]["detail"] == "no encoder pool on this host"
    assert checks["host-a", "worker h3-a0"]["detail"] == "not started yet: `h3flow start` starts it"
    assert checks["host-a", "link → host-b"]["detail"].startswith("the receiver on host-b is not running yet")


def test_production_hardware_that_is_not_here_is_named_with_its_fix(sshd: SshServer, tmp_path: Path) -> None:
    dead = sshd.add_alias("h8-pf-down", port=1)
    hm = host_map(tmp_path, sshd.alias, production=True, decoder_alias=dead)
    config, path = write_config(tmp_path, hm)
    models = tmp_path / "ComfyUI" / "models" / "diffusion_models"
    models.mkdir(parents=True)
    (models / config.model.dit).write_bytes(b"weights")  # one of the four files host-a needs
    checkout(tmp_path / "ComfyUI", COMFY)  # the real upstream pre-images (skips without ../shared/upstream)
    checkout(tmp_path / "raylight", RAYLIGHT)
    code, checks = preflight(path, sshd)
    assert code == 1
    torch = checks["host-a", "torch"]
    assert torch["status"] == "fail" and "cpu build): the host's nvidia GPUs need a CUDA build" in torch["detail"]
    assert "pip install torch --index-url https://download.pytorch.org/whl/cu126" in torch["fix"]
    gpus = checks["host-a", "gpus"]
    assert gpus["status"] == "fail" and gpus["detail"].startswith(
        "no NVIDIA GPU visible on host-a: nvidia-smi not found"
    )
    assert "install the NVIDIA driver (nvidia-smi)" in gpus["fix"]
    missing = checks["host-a", "models"]
    assert missing["status"] == "fail" and config.model.dit not in missing["detail"]
    for name in (config.model.lora, config.model.text_encoder, config.model.vae):
        assert name in missing["detail"]
    patches = checks["host-a", "patches"]
    assert patches["status"] == "fail" and "comfy-turing-lerp.patch not applied" in patches["detail"]
    assert "raylight-sm75-ulysses.patch not applied" in patches["detail"]
    assert patches["fix"] == "`h3flow patches apply --host host-a`"
    assert checks["host-a", "comfyui a"]["detail"].startswith(
        "not started yet: `h3flow start` starts it at http://127.0.0.1:"
    )
    assert (
        checks["host-a", "retain"]["detail"]
        == "H3_MP_RETAIN_CPU_WEIGHTS=1 in the environment `h3flow start` gives comfyui-a"
    )
    down = checks["host-b", "ssh"]
    assert down["status"] == "fail" and "cannot reach host host-b (ssh h8-pf-down) at 127.0.0.1:1" in down["detail"]
    assert "known_hosts" in down["fix"] and checks["host-b", "…"]["status"] == "skip"


def test_the_embedded_default_is_checked_without_ssh(tmp_path: Path) -> None:
    subprocess.run(
        [H3FLOW, "config-adapt", "--local", "--workdir", str(tmp_path / "wd"), "-o", str(tmp_path / "local.json")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    code, checks = preflight(tmp_path / "local.json")
    assert code == 0
    assert checks["host-a", "ssh"]["detail"] == "this machine (embedded default): no SSH"
    assert checks["host-b", "gpus"]["detail"] == "cpu (reference model): 1 cpu device(s), no GPU checks"
    assert checks["host-a", "venv"]["status"] == "ok" and checks["host-a", "clock"]["detail"] == "this machine"


# --------------------------------------------------------------------------- ComfyUI's /object_info
@pytest.fixture
def object_info_server() -> Iterator[tuple[str, dict[str, Any]]]:
    """A real HTTP endpoint serving /object_info (the shipped transcription of upstream
    ComfyUI + Raylight + the pack, which tests may edit) in place of a H3 host's ComfyUI."""
    info = upstream_object_info()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(info).encode() if self.path == "/object_info" else b"{}"
            self.send_response(200 if self.path == "/object_info" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", info
    server.shutdown()
    server.server_close()


def test_object_info_missing_nodes_inputs_and_models_are_named(
    sshd: SshServer, tmp_path: Path, object_info_server: tuple[str, dict[str, Any]]
) -> None:
    url, info = object_info_server
    config, path = write_config(tmp_path, host_map(tmp_path, sshd.alias, production=True))
    pools = [p.model_copy(update={"comfy_url": url}) for p in config.pools]
    config = config.model_copy(update={"pools": pools})
    view = HostView(
        config, config.hosts["host-a"], False, [s for s in service_specs(config, path) if s.host == "host-a"]
    )
    view.procs = {"comfyui-a": Proc(1, True)}  # ComfyUI counts as started; its /object_info is the server above
    (ready,) = check_comfyui(view, fetch_object_info)
    assert ready.status == "ok" and "holds every node and input of its templates" in ready.detail
    # upstream drift: a new required input with a default is filled (a warning), one without is an error
    info["RayInitializer"]["input"]["required"]["pipefusion_degree"] = ["INT", {"default": 2, "min": 1}]
    (drifted,) = check_comfyui(view, fetch_object_info)
    assert (drifted.status, drifted.detail) == (
        "warn",
        f"{url}: h3-sample: node 4 (RayInitializer) input 'pipefusion_degree' is not set by the template; "
        "using this ComfyUI's default 2",
    )
    info["XFuserKSamplerAdvanced"]["input"]["required"]["guider"] = ["GUIDER"]
    (unfillable,) = check_comfyui(view, fetch_object_info)
    assert unfillable.status == "fail"
    assert unfillable.detail == (
        "h3-sample: node 7 (XFuserKSamplerAdvanced) requires input 'guider', which the template does not set "
        "and this ComfyUI gives no default for: set it to a GUIDER link in workflows/h3-sample.json"
    )
    assert unfillable.fix.startswith("set the named inputs in the templates (workflows/)")
    del info["XFuserKSamplerAdvanced"]["input"]["required"]["guider"]
    del info["RayInitializer"]
    info["UNETLoader"]["input"]["required"]["unet_name"][0] = ["some_other_model.safetensors"]
    info["H3SaveConditioning"]["input"]["required"].pop("path")
    (broken,) = check_comfyui(view, fetch_object_info)
    assert broken.status == "fail" and broken.name == "comfyui a"
    assert "h3-sample: node 4 (RayInitializer): node type not installed on this ComfyUI" in broken.detail
    assert "h3-encode: node" in broken.detail and "(H3SaveConditioning): unknown input 'path'" in broken.detail
    assert "install Raylight into custom_nodes" in broken.fix and "`h3flow nodes install --host host-a`" in broken.fix
    gone = view.config.pools[0].model_copy(update={"comfy_url": "http://127.0.0.1:1"})
    view.config = config.model_copy(update={"pools": [gone, *config.pools[1:]]})
    (down,) = check_comfyui(view, fetch_object_info)
    assert down.status == "fail" and "http://127.0.0.1:1 does not answer" in down.detail


# --------------------------------------------------------------------------- judging facts
def _view(tmp_path: Path, sshd_alias: str = "h3test", production: bool = True) -> HostView:
    config, _path = write_config(tmp_path, host_map(tmp_path, sshd_alias, production=production))
    return HostView(config, config.hosts["host-a"], False, [], reachable=True)


def test_gpus_that_differ_from_the_host_map_are_named(tmp_path: Path) -> None:
    view = _view(tmp_path)
    view.facts = {
        "gpus": {
            "tool": "nvidia-smi",
            "gpus": [
                {"index": 0, "name": "Tesla T10", "memory_mb": 15360.0, "arch": "sm75"},
                {"index": 1, "name": "NVIDIA GeForce RTX 3080 Ti", "memory_mb": 12288.0, "arch": "sm86"},
                {"index": 2, "name": "Tesla T10", "memory_mb": 15360.0, "arch": "sm75"},
                {"index": 3, "name": "Tesla T10", "memory_mb": 15360.0, "arch": "sm75"},
            ],
        }
    }
    (check,) = check_gpus(view)
    assert check.status == "fail"
    assert "GPU 1 is NVIDIA GeForce RTX 3080 Ti, the host map says T10" in check.detail
    assert (
        "GPU 1 has 12.0 GiB, the host map says 16 GB" in check.detail
        and "GPU 1 is sm86, the host map says sm75" in check.detail
    )
    assert "GPU 0" not in check.detail.split("(nvidia-smi")[0]  # the T10 (15 GiB as nvidia-smi counts) matches
    others = view.facts["gpus"]["gpus"][2:]
    view.facts["gpus"]["gpus"] = view.facts["gpus"]["gpus"][:1] + others
    assert "GPU 1 (T10) not visible" in check_gpus(view)[0].detail
    view.facts["gpus"]["gpus"].insert(1, {"index": 1, "name": "Tesla T10", "memory_mb": 15360.0, "arch": "sm75"})
    assert check_gpus(view)[0].status == "ok"


def test_low_disk_and_clock_skew_fail_with_their_fix(tmp_path: Path) -> None:
    view = _view(tmp_path)
    root = view.host.storage.root
    view.facts = {"disk": {root: {"free": 3 << 30, "at": root}}}
    (disk,) = check_disk(view)
    assert (
        disk.status == "fail" and f"{root} has 3.0 GiB free (need ≥ 20 GiB)" in disk.detail and "free space" in disk.fix
    )
    view.skew = (3.5, 0.01)
    (clock,) = check_clock(view)
    assert clock.status == "fail" and clock.detail.startswith("+3500 ms") and "chrony" in clock.fix
    view.skew = (0.02, 0.01)
    assert check_clock(view)[0].status == "ok"
