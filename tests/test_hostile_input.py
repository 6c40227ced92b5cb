"""Hostile input (issue 23, point 3, and issue 24, point 6): each case the fault run found,
through the real command line. A bad batch or host map gets one clear error (a few lines
at most, with a count) and exit 2 before anything starts; nothing crashes, nothing slips
through, nothing is read without limit.

Batches go through `h3flow run` with an embedded-default local.json whose Prefect server
is not running: a batch that validation refuses never gets as far as asking it.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from clirun import Outcome, invoke
from PIL import Image
from test_cli import make_config

from h3flow.config.models import load_local_config
from h3flow.core.batch import load_batch
from h3flow.core.errors import ConfigError
from h3flow.core.specs import get_spec

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "host-map.example.json"


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_config(tmp_path_factory.mktemp("hostile") / "wd")


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("images") / "ok.png"
    Image.new("RGB", (32, 18), (10, 120, 200)).save(path)
    return path


def clip(picture: Path, **fields: object) -> dict[str, object]:
    return {
        "id": "c01",
        "prompt": "slow pan over a lake",
        "image": str(picture),
        "spec": "tiny",
        "seconds": 1,
        **fields,
    }


def write_batch(path: Path, *clips: dict[str, object]) -> Path:
    path.write_text(json.dumps({"name": "hostile", "clips": list(clips)}))
    return path


def run(batch: Path, config: Path) -> Outcome:
    return invoke(["run", str(batch), "--background", "-c", str(config)])


def refused(outcome: Outcome, *expected: str, lines: int = 1) -> str:
    """The error text after checking it is one (or ``lines``) line(s), exit 2, no traceback."""
    text = outcome.stdout + outcome.stderr
    assert outcome.exit_code == 2, text
    assert text.startswith("error: ") and "Traceback" not in text, text
    assert len(outcome.lines) == lines, text
    for part in expected:
        assert part in text, text
    return text


def subprocess_h3flow(*args: str, cwd: Path, memory: int = 2 << 30) -> subprocess.CompletedProcess[str]:
    """The real command in a child process whose address space is capped (so an unbounded
    read fails there, not on the machine)."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    env = {k: v for k, v in os.environ.items() if k not in ("H3FLOW_CONFIG", "COLUMNS")}
    return subprocess.run(
        [sys.executable, "-m", "h3flow.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=cap,
    )


# --------------------------------------------------------------------------- the batch file itself
def test_a_batch_that_is_a_symlink_to_dev_zero_is_refused_before_a_byte_is_read(tmp_path: Path, config: Path) -> None:
    batch = tmp_path / "zero.json"
    batch.symlink_to("/dev/zero")
    done = subprocess_h3flow("run", str(batch), "--background", "-c", str(config), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr == f"error: {batch}: is not a regular file (a device, pipe or socket?)\n"


def test_a_fifo_batch_is_refused_without_waiting_for_a_writer(tmp_path: Path, config: Path) -> None:
    batch = tmp_path / "pipe.json"
    os.mkfifo(batch)
    done = subprocess_h3flow("run", str(batch), "--background", "-c", str(config), cwd=tmp_path)
    assert done.returncode == 2 and "is not a regular file" in done.stderr, done.stderr[-2000:]


def test_an_oversized_batch_is_refused_at_the_bound_with_little_memory(tmp_path: Path, config: Path) -> None:
    batch = tmp_path / "huge.json"
    with open(batch, "wb") as handle:
        handle.truncate(65 << 20)  # sparse: 65 MiB of NULs, one more than a batch may weigh
    tracemalloc.start()
    try:
        outcome = run(batch, config)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    refused(outcome, "larger than 64 MiB")
    assert peak < 80 << 20, peak  # read in 1 MiB pieces up to the bound, never the file whole


# --------------------------------------------------------------------------- clips
def test_a_nul_in_an_image_path_is_one_line_not_a_traceback(tmp_path: Path, config: Path, image: Path) -> None:
    outcome = run(write_batch(tmp_path / "b.json", clip(image, image=f"{image}\x00.png")), config)
    refused(outcome, "clips[0].image: image path", "holds a control character '\\x00'")


@pytest.mark.parametrize(
    ("field", "value"),
    [("seed", True), ("seed", False), ("seed", "7"), ("seed", 1.0), ("steps", True), ("seconds", True)],
)
def test_numbers_are_json_numbers(tmp_path: Path, config: Path, image: Path, field: str, value: object) -> None:
    """``"seed": true`` used to become seed 1."""
    outcome = run(write_batch(tmp_path / "b.json", clip(image, **{field: value})), config)
    refused(outcome, f"clips[0].{field}: Input should be a valid")


@pytest.mark.parametrize(
    ("prompt", "why"),
    [
        ("a calm lake\x00", "holds an unprintable character '\\x00'"),
        ("a \x1b[31mred\x1b[0m lake", "holds an unprintable character '\\x1b'"),
        ("a \x9b31m lake", "holds an unprintable character '\\x9b'"),  # the one-byte CSI
        ("a calm lake\r", "holds an unprintable character '\\r'"),
        ("lake \u202eekal", "holds an unprintable character '\\u202e'"),  # a direction override
        ("   \n\t  ", "is blank"),
    ],
)
def test_prompts_are_printable_text(tmp_path: Path, config: Path, image: Path, prompt: str, why: str) -> None:
    refused(run(write_batch(tmp_path / "b.json", clip(image, prompt=prompt)), config), f"clips[0].prompt: prompt {why}")


def test_newlines_and_tabs_in_a_prompt_are_text(tmp_path: Path, image: Path) -> None:
    batch = load_batch(write_batch(tmp_path / "b.json", clip(image, prompt="a calm lake,\n\tthen rain")))
    assert batch.clips[0].prompt == "a calm lake,\n\tthen rain"


def test_a_100_megapixel_image_is_refused(tmp_path: Path, config: Path) -> None:
    big = tmp_path / "big.png"
    Image.new("1", (10_000, 10_000)).save(big)  # 1 bit per pixel: a small file, 100 Mpx
    outcome = run(write_batch(tmp_path / "b.json", clip(big)), config)
    refused(outcome, f"image {big} is 10000x10000 (100 Mpx), more than 40 Mpx")


def test_an_image_under_the_cap_is_accepted(tmp_path: Path) -> None:
    eight_k = tmp_path / "8k.png"
    Image.new("1", (7680, 4320)).save(eight_k)
    assert load_batch(write_batch(tmp_path / "b.json", clip(eight_k))).clips[0].image == eight_k.resolve()


@pytest.mark.parametrize(("given", "stored"), [("SD", "sd"), ("Hd", "hd"), ("TINY", "tiny"), ("sd", "sd")])
def test_specs_are_case_insensitive(tmp_path: Path, image: Path, given: str, stored: str) -> None:
    """The README's tables say "SD" (issue 24, point 6)."""
    assert load_batch(write_batch(tmp_path / "b.json", clip(image, spec=given))).clips[0].spec == stored


def test_every_reader_of_a_spec_takes_any_case() -> None:
    assert get_spec("SD") is get_spec("sd") and get_spec("Hd") is get_spec("hd")
    with pytest.raises(ConfigError, match="unknown spec '8K'"):
        get_spec("8K")


def test_an_unknown_spec_is_still_refused(tmp_path: Path, config: Path, image: Path) -> None:
    refused(run(write_batch(tmp_path / "b.json", clip(image, spec="8K")), config), "unknown spec '8K'")


def test_a_batch_with_many_problems_is_a_count_and_the_first_ten(tmp_path: Path, config: Path, image: Path) -> None:
    clips = [clip(image, id=f"c{i:03d}", spec="8k") for i in range(100)]
    text = refused(run(write_batch(tmp_path / "b.json", *clips), config), lines=12)
    lines = text.splitlines()
    assert lines[0] == f"error: {tmp_path / 'b.json'}: 100 problems; the first 10:"
    assert lines[1] == "  clips[0].spec: unknown spec '8k' (known: sd, hd, tiny)"
    assert lines[-1] == "  ... and 90 more"


def test_a_huge_key_is_named_not_echoed(tmp_path: Path, config: Path, image: Path) -> None:
    text = refused(run(write_batch(tmp_path / "b.json", clip(image, **{"x" * 100_000: 1})), config))
    assert len(text) < 300


# --------------------------------------------------------------------------- host maps
def host_map(tmp_path: Path, change: object) -> Path:
    data = json.loads(EXAMPLE.read_text())
    change(data)  # type: ignore[operator]
    path = tmp_path / "host-map.json"
    path.write_text(json.dumps(data))
    return path


def adapt(path: Path, out: Path) -> Outcome:
    return invoke(["config-adapt", str(path), "-o", str(out)])


def _set(*keys: object, value: object) -> object:
    def change(data: dict) -> None:
        node = data
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return change


HOSTILE_HOST_MAPS = {
    "address 0.0.0.0": (_set("hosts", 2, "address", value="0.0.0.0"), "address 0.0.0.0 means every interface"),
    "address ::": (_set("hosts", 2, "address", value="::"), "address :: means every interface"),
    "address 0": (_set("hosts", 2, "address", value="0"), "IPv4 0.0.0.0 in an unusual form"),
    "address 0x0": (_set("hosts", 2, "address", value="0x0"), "IPv4 0.0.0.0 in an unusual form"),
    "address 127.1": (_set("hosts", 2, "address", value="127.1"), "IPv4 127.0.0.1 in an unusual form"),
    "address with an option": (
        _set("hosts", 2, "address", value="10.0.0.2 -oProxyCommand=touch /tmp/pwned"),
        "is neither an IP address nor a host name",
    ),
    "address that is an option": (
        _set("hosts", 2, "address", value="-oProxyCommand=x"),
        "is neither an IP address nor a host name",
    ),
    "multicast address": (_set("hosts", 2, "address", value="224.0.0.1"), "broadcast or multicast"),
    "ssh alias that is an option": (
        _set("hosts", 2, "ssh_alias", value="-oProxyCommand=x"),
        "is not an ssh host alias or login",
    ),
    "user with an option": (_set("hosts", 2, "user", value="h3 -l root"), "is not an ssh host alias or login"),
    "relative store root": (_set("hosts", 0, "storage", "root", value="store"), "'store' is not an absolute path"),
    "store root out of bounds": (
        _set("hosts", 0, "storage", "root", value="../../../../etc"),
        "'../../../../etc' is not an absolute path",
    ),
    "store root with ..": (
        _set("hosts", 0, "storage", "root", value="/srv/h3flow/../../etc"),
        "has a '..' component",
    ),
    "store root /": (_set("hosts", 0, "storage", "root", value="/"), "'/' is the filesystem root"),
    "outputs in /usr": (
        _set("hosts", 2, "storage", "outputs", value="/usr/share/videos"),
        "is inside the system's /usr",
    ),
    "runs_dir out of bounds": (_set("runs_dir", value="../../../../etc"), "is not an absolute path"),
    "runs_dir in /etc": (_set("runs_dir", value="/etc/cron.d"), "is inside the system's /etc"),
    "relative venv": (_set("hosts", 1, "venv", value="venv"), "'venv' is not an absolute path"),
    "inbox in ~/.ssh": (_set("prefect", "schedule", "inbox", value="/root/.ssh"), "is inside an ssh folder"),
    "env PATH": (_set("hosts", 0, "env", value={"PATH": "/tmp/evil:/usr/bin"}), "env PATH: loader variables"),
    "env BASH_ENV": (_set("hosts", 0, "env", value={"BASH_ENV": "/tmp/x"}), "env BASH_ENV: loader variables"),
    "secret /etc/shadow": (
        _set("transfer", "secret", value={"source": "file", "path": "/etc/shadow"}),
        "'/etc/shadow' is inside the system's /etc",
    ),
    "secret an ssh key": (
        _set("transfer", "secret", value={"source": "file", "path": "/home/h3/.ssh/id_ed25519"}),
        "is inside an ssh folder",
    ),
    "relative secret": (
        _set("transfer", "secret", value={"source": "file", "path": "secrets/transfer.key"}),
        "is not an absolute path",
    ),
    "secret in Prefect": (
        _set("transfer", "secret", value={"source": "prefect-secret", "name": "h3flow-transfer-secret"}),
        "can be read by anyone who reaches the API",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_HOST_MAPS))
def test_hostile_host_maps_are_refused_in_one_line_and_write_nothing(tmp_path: Path, case: str) -> None:
    change, message = HOSTILE_HOST_MAPS[case]
    out = tmp_path / "local.json"
    refused(adapt(host_map(tmp_path, change), out), message)
    assert not out.exists()


def test_sound_values_next_to_the_hostile_ones_are_accepted(tmp_path: Path) -> None:
    def change(data: dict) -> None:
        data["hosts"][2]["address"] = "host-b.lab.example"
        data["hosts"][1]["address"] = "fd00::3"
        data["hosts"][0]["env"] = {"HF_HOME": "/srv/hf", "PYTHONUNBUFFERED": "1"}
        data["transfer"]["secret"] = {"source": "file", "path": "/etc/h3flow/secrets/transfer.key"}
        del data["runs_dir"]

    out = tmp_path / "local.json"
    outcome = adapt(host_map(tmp_path, change), out)
    assert outcome.exit_code == 0, outcome.stderr
    local = load_local_config(out)
    assert [r.bind for r in local.receivers] == ["host-b.lab.example"]
    assert local.runs_dir == "/srv/h3flow/store/runs"  # the main sampler host's store, not the cwd
    assert local.transfer.secret.path == "/etc/h3flow/secrets/transfer.key"


def test_a_hand_edited_local_json_cannot_bind_every_interface(tmp_path: Path) -> None:
    out = tmp_path / "local.json"
    assert adapt(EXAMPLE, out).exit_code == 0
    data = json.loads(out.read_text())
    data["receivers"][0]["bind"] = "0.0.0.0"
    out.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"receivers\[0\]\.bind: address 0\.0\.0\.0 means every interface"):
        load_local_config(out)


# --------------------------------------------------------------------------- the real exit codes
def test_the_installed_command_exits_2_in_one_line(tmp_path: Path, config: Path, image: Path) -> None:
    """A few of the cases above through a real process: exit status 2 and stderr as printed."""
    bad = write_batch(tmp_path / "nul.json", clip(image, image="a\x00b.png"))
    done = subprocess_h3flow("run", str(bad), "--background", "-c", str(config), cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "control character" in done.stderr
    seed = write_batch(tmp_path / "seed.json", clip(image, seed=True))
    done = subprocess_h3flow("run", str(seed), "--background", "-c", str(config), cwd=tmp_path)
    assert done.returncode == 2 and "clips[0].seed: Input should be a valid integer" in done.stderr
    hm = host_map(tmp_path, HOSTILE_HOST_MAPS["address 0.0.0.0"][0])
    done = subprocess_h3flow("config-adapt", str(hm), "-o", str(tmp_path / "local.json"), cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "every interface" in done.stderr
    assert not (tmp_path / "local.json").exists()
