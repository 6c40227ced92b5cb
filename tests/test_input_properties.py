"""Thousands of generated batch files and host maps through the real command line
(issue 23, "Done when"): for each, either a valid result or an error of at most 20 lines
with exit 2 — never a traceback — in under 200 MB of memory.

Documents are near-valid ones with hostile values mixed in (control characters, ANSI
escapes, lone surrogates, booleans for numbers, NaN, relative and system paths, devices,
0.0.0.0, option text, loader variables), arbitrary JSON, and text that is not JSON at
all. A valid result is checked against rules written here, independently of the models
(an accepted seed came from a JSON integer, an accepted address is no "every interface"
address, ...), so a validator that lets something through fails the test.

Batches: every document goes through ``load_batch`` (what ``h3flow run`` validates a
batch with before it submits anything); each one it refuses also goes through
``h3flow run`` itself (in-process, tests/clirun.py), whose exit code and output are
checked. One it accepts is not run (that would submit it); its clips are checked
instead. Host maps go through ``h3flow config-adapt``, and what it writes is read back.

Examples: 1,000 batches + 1,000 host maps + 200 raw documents as each (2,400 in all, 40 s
of CPU on the 2-core development machine); ``H3FLOW_TEST_EXAMPLES=N`` runs N of each kind
(and N/5 raw ones).
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import math
import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from clirun import Outcome, invoke
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image
from test_cli import make_config

from h3flow.config.models import load_local_config
from h3flow.core.batch import Batch, load_batch
from h3flow.core.errors import H3FlowError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = json.loads((ROOT / "examples" / "host-map.example.json").read_text())
T = TypeVar("T")
MAX_LINES = 20
MAX_MEMORY = 200 << 20
BATCH_EXAMPLES = int(os.environ.get("H3FLOW_TEST_EXAMPLES", "1000"))  # more with H3FLOW_TEST_EXAMPLES=N
HOST_MAP_EXAMPLES = BATCH_EXAMPLES
RAW_EXAMPLES = BATCH_EXAMPLES // 5
SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
}


# --------------------------------------------------------------------------- the place
class Place:
    """A folder with the files hostile batches point at, and an embedded-default config."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = make_config(root / "wd")
        Image.new("RGB", (32, 18), (200, 100, 0)).save(root / "ok.png")
        Image.new("1", (10_000, 10_000)).save(root / "huge.png")  # 100 Mpx
        (root / "folder.png").mkdir()
        os.mkfifo(root / "pipe.png")
        (root / "zero.png").symlink_to("/dev/zero")
        (root / "text.png").write_text("not an image")
        self.counter = itertools.count()

    def next_file(self, suffix: str) -> Path:
        return self.root / f"doc-{next(self.counter)}{suffix}"


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Place:
    return Place(tmp_path_factory.mktemp("properties"))


def measured(call: Callable[[], T]) -> tuple[T, int]:
    """``call()``'s result and the peak of Python memory it allocated (tracing only the
    call: tracing hypothesis too would double the test's time)."""
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def check_refusal(outcome: Outcome, message: str | None = None) -> None:
    text = outcome.stdout + outcome.stderr
    assert outcome.exit_code == 2, text[-3000:]
    assert text.startswith("error: ") and "Traceback" not in text, text[-3000:]
    assert len(outcome.lines) <= MAX_LINES, text[-3000:]
    if message is not None:
        assert outcome.lines[0] == f"error: {message}", text[-3000:]


# --------------------------------------------------------------------------- values
HOSTILE_TEXT = [
    "",
    " ",
    "\t\n ",
    "\x00",
    "a\x00b",
    "\x1b[2J\x1b[31mred",
    "\x9b31m",
    "\u202eabc",
    "line\u2028break",
    "\ud800",
    "\udc80",
    "../../../../etc/passwd",
    "/etc/shadow",
    "-oProxyCommand=touch /tmp/pwned",
    "x" * 5000,
    "é" * 300,
    "$(reboot)",
    "`id`",
    "sd",
    "SD",
    "Hd",
    "0.0.0.0",
]
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(HOSTILE_TEXT),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


def anything_or(*good: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly sound values of a field, sometimes hostile ones, sometimes any JSON."""
    return st.one_of(*good, st.sampled_from(HOSTILE_TEXT), json_values)


IMAGES = ["ok.png", "{root}/ok.png", "huge.png", "folder.png", "pipe.png", "zero.png", "text.png", "missing.png"]
IMAGES += ["/etc/passwd", "/dev/zero", "/proc/self/mem", "", "a\x00b.png", "\ud800.png", "../" * 40 + "ok.png"]

clip_documents = st.fixed_dictionaries(
    {
        "id": anything_or(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,8}", fullmatch=True), st.sampled_from(["c1"])),
        "prompt": anything_or(st.text(min_size=1, max_size=40), st.text(max_size=5000)),
        "image": anything_or(st.sampled_from(IMAGES)),
    },
    optional={
        "spec": anything_or(st.sampled_from(["sd", "hd", "tiny", "SD", "Tiny", "HD", "8k", " sd"])),
        "seconds": anything_or(st.floats(min_value=-1, max_value=40), st.integers(-2, 40)),
        "seed": anything_or(st.integers(min_value=-5, max_value=2**64), st.booleans()),
        "steps": anything_or(st.integers(-1, 120), st.booleans()),
        "image_sha256": anything_or(st.just("ab" * 32)),
        "colour": json_values,
    },
)
batch_documents = st.fixed_dictionaries(
    {"clips": st.one_of(st.lists(clip_documents, max_size=6), json_values)},
    optional={"name": anything_or(st.text(min_size=1, max_size=20)), "extra": json_values},
)
RAW = [
    "",
    "{",
    '{"clips": [',
    "NaN",
    "[" * 5000 + "]" * 5000,
    '{"clips": ' + "[" * 3000 + "]" * 3000 + "}",
    "1" * 5000,
    '{"clips": [{"seed": ' + "9" * 5000 + "}]}",
    "\ufeff{}",
]
raw_documents = st.one_of(
    st.sampled_from(RAW).map(str.encode),
    st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.binary(max_size=300),
)


# --------------------------------------------------------------------------- batches
UNPRINTABLE = {*range(0, 9), *range(11, 32), *range(0x7F, 0xA0), 0x2028, 0x2029, *range(0x202A, 0x202F)}
UNPRINTABLE |= {*range(0x2066, 0x206A), *range(0xD800, 0xE000)}


def check_accepted_batch(batch: Batch, raw: object) -> None:
    """What an accepted batch must be, by rules written here (not the models')."""
    assert isinstance(raw, dict) and isinstance(raw["clips"], list) and raw["clips"]
    ids = [clip.id for clip in batch.clips]
    assert len(set(ids)) == len(ids)
    for clip, given_clip in zip(batch.clips, raw["clips"], strict=True):
        for field in ("seed", "steps"):  # "seed": true is not seed 1
            if field in given_clip:
                assert type(given_clip[field]) is int, given_clip
        if "seconds" in given_clip:
            assert type(given_clip["seconds"]) in (int, float) and math.isfinite(given_clip["seconds"])
        assert 0 <= clip.seed < 2**63 and 1 <= clip.steps <= 100 and 0 < clip.seconds <= 30
        assert clip.spec in ("sd", "hd", "tiny")
        assert clip.prompt.strip() and not {ord(c) for c in clip.prompt} & UNPRINTABLE, clip.prompt
        assert clip.image.is_absolute() and clip.image.is_file(), clip.image
        with Image.open(clip.image) as im:
            assert im.format in ("PNG", "JPEG", "WEBP", "BMP", "TIFF") and im.size[0] * im.size[1] <= 40_000_000


def check_batch_file(place: Place, path: Path, raw: object) -> None:
    def validate() -> Batch | H3FlowError:
        try:
            return load_batch(path)
        except H3FlowError as exc:
            return exc

    result, peak = measured(validate)
    assert peak < MAX_MEMORY, peak
    if isinstance(result, Batch):
        check_accepted_batch(result, raw)
        return
    outcome, peak = measured(lambda: invoke(["run", str(path), "--background", "-c", str(place.config)]))
    assert peak < MAX_MEMORY, peak
    check_refusal(outcome, str(result))


@settings(max_examples=BATCH_EXAMPLES, **SETTINGS)  # type: ignore[arg-type]
@given(doc=batch_documents)
def test_generated_batches_give_a_batch_or_a_short_error(place: Place, doc: dict) -> None:
    doc = json.loads(json.dumps(doc).replace("{root}", str(place.root)))  # NaN stays NaN, as JSON allows
    path = place.next_file(".json")
    path.write_text(json.dumps(doc))
    check_batch_file(place, path, doc)


@settings(max_examples=RAW_EXAMPLES, **SETTINGS)  # type: ignore[arg-type]
@given(data=raw_documents)
def test_raw_batch_files_give_a_batch_or_a_short_error(place: Place, data: bytes) -> None:
    path = place.next_file(".json")
    path.write_bytes(data)
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):
        raw = None
    check_batch_file(place, path, raw)


# --------------------------------------------------------------------------- host maps
def example_paths(node: object, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += example_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out += example_paths(value, (*prefix, index))
    return out


TARGETS = [
    *example_paths(EXAMPLE),
    ("hosts", 0, "env"),
    ("hosts", 2, "env"),
    ("transfer", "secret", "path"),
    ("prefect", "auth"),
    ("prefect", "database"),
    ("hosts", 2, "storage", "outputs"),
]
ADDRESSES = ["0.0.0.0", "::", "0", "0x0", "127.1", "10.0.0.2 -oProxyCommand=x", "-oProxyCommand=x", "224.0.0.1"]
ADDRESSES += ["255.255.255.255", "fd00::2", "host-b.lab", "localhost", "10.10.0.9", "a b", "h\u00e9st"]
PATHS = ["store", "../../../../etc", "/srv/h3flow/../../etc", "/", "/etc", "/etc/shadow", "/etc/h3flow/x"]
PATHS += ["/usr/share/h3", "/root/.ssh/id", "/srv/h3flow/ok", "~/h3", "/proc/self", "/var/lib/h3flow/s", "./x"]
ENVS = [
    {"PATH": "/tmp"},
    {"LD_PRELOAD": "/tmp/x.so"},
    {"BASH_ENV": "/tmp/x"},
    {"PYTHONPATH": "/tmp"},
    {"HF_HOME": "/srv/hf"},
    {"A B": "1"},
    {"OK": "\x1b[31m"},
]
SECRETS = [
    {"source": "file", "path": "/etc/shadow"},
    {"source": "file", "path": "/etc/h3flow/secrets/transfer.key"},
    {"source": "file", "path": "relative.key"},
    {"source": "file"},
    {"source": "prefect-secret", "name": "h3flow-transfer-secret"},
    {"source": "env", "name": "H3FLOW_TRANSFER_SECRET"},
]
SSH_NAMES = ["-oProxyCommand=x", "h3 -l root", "", "host-b", "h3", "a;b", "\x1b[1m"]
# each kind of field with the hostile (and sound) values it may meet, so each is hit often
KINDS = [
    ([("hosts", i, "address") for i in range(3)], ADDRESSES),
    (
        [
            ("hosts", 0, "storage", "root"),
            ("hosts", 2, "storage", "outputs"),
            ("hosts", 1, "venv"),
            ("hosts", 0, "comfy_dir"),
            ("runs_dir",),
            ("prefect", "schedule", "inbox"),
            ("transfer", "secret", "path"),
        ],
        PATHS,
    ),
    ([("hosts", i, field) for i in range(3) for field in ("ssh_alias", "user")], SSH_NAMES),
    ([("hosts", 0, "env"), ("hosts", 2, "env")], ENVS),
    ([("transfer", "secret"), ("prefect", "auth")], SECRETS),
]
targeted = st.one_of(
    *(st.tuples(st.sampled_from(targets), st.sampled_from(values), st.just(False)) for targets, values in KINDS)
)
anywhere = st.tuples(st.sampled_from(TARGETS), json_values, st.booleans())
mutations = st.lists(st.one_of(targeted, anywhere), min_size=1, max_size=4)


def apply(doc: dict, path: tuple, value: object, delete: bool) -> None:
    node: object = doc
    for key in path[:-1]:
        there = (
            key in node
            if isinstance(node, dict)
            else isinstance(node, list) and isinstance(key, int) and key < len(node)
        )
        if not there:
            return  # an earlier mutation replaced the way there
        node = node[key]  # type: ignore[index]
    last = path[-1]
    if isinstance(node, dict):
        if delete:
            node.pop(last, None)
        else:
            node[last] = value
    elif isinstance(node, list) and isinstance(last, int) and last < len(node):
        node[last] = value


def check_path(path: str | None, secret: bool = False) -> None:
    if path is None:
        return
    assert path.startswith("/") and ".." not in path.split("/"), path
    if secret:
        assert ".ssh" not in path.split("/") and (not path.startswith("/etc/") or path.startswith("/etc/h3flow/"))


def check_address(address: str) -> None:
    assert address and not address.startswith("-") and not any(c.isspace() for c in address), address
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        assert address not in ("0", "0x0") and not address.replace(".", "").isdigit(), address
        return
    assert not ip.is_unspecified and not ip.is_multicast and str(ip) != "255.255.255.255", address


def check_local_json(out: Path) -> None:
    """What an accepted host map must resolve to, by rules written here."""
    local = load_local_config(out)
    for host in local.hosts.values():
        check_address(host.address)
        for name in (host.ssh_alias, host.user):
            assert name is None or (not name.startswith("-") and not any(c.isspace() for c in name)), name
        for path in (host.venv, host.comfy_dir, host.raylight_dir, *host.storage.model_dump().values()):
            check_path(path)
    for receiver in local.receivers:
        check_address(receiver.bind)
    for route in local.routes:
        check_address(route.address)
        check_path(route.store_root)
    check_path(local.runs_dir)
    if local.prefect.schedule:
        check_path(local.prefect.schedule.inbox)
    secrets = [local.transfer.secret, local.prefect.auth, local.prefect.database and local.prefect.database.password]
    for secret in secrets:
        if secret:
            assert secret.source in ("env", "file")
            check_path(secret.path, secret=True)
    envs = [host.env for host in local.hosts.values()] + [pool.env for pool in local.pools]
    for env in envs:
        for name, value in env.items():
            assert name not in ("PATH", "BASH_ENV", "PYTHONPATH") and not name.startswith("LD_"), name
            assert not any(ord(c) < 32 for c in name + value), (name, value)


def check_host_map_file(place: Place, path: Path) -> None:
    out = place.next_file(".local.json")
    outcome, peak = measured(lambda: invoke(["config-adapt", str(path), "-o", str(out)]))
    assert peak < MAX_MEMORY, peak
    if outcome.exit_code == 0:
        check_local_json(out)
        out.unlink()
    else:
        check_refusal(outcome)
        assert not out.exists()


@settings(max_examples=HOST_MAP_EXAMPLES, **SETTINGS)  # type: ignore[arg-type]
@given(changes=mutations)
# found by CI: a host replaced by a list, then a change inside that host (the helper compared a key with an index)
@example(changes=[(("hosts", 0), [], False), (("hosts", 0, "storage", "root"), "store", False)])
def test_generated_host_maps_give_a_config_or_a_short_error(place: Place, changes: list) -> None:
    doc = json.loads(json.dumps(EXAMPLE))
    for target, value, delete in changes:
        apply(doc, target, value, delete)
    path = place.next_file(".json")
    path.write_text(json.dumps(doc))
    check_host_map_file(place, path)


@settings(max_examples=RAW_EXAMPLES, **SETTINGS)  # type: ignore[arg-type]
@given(data=raw_documents)
def test_raw_host_map_files_give_a_short_error(place: Place, data: bytes) -> None:
    path = place.next_file(".json")
    path.write_bytes(data)
    check_host_map_file(place, path)
