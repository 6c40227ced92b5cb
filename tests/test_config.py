"""config-adapt: resolution, determinism, drift, and every kind of bad input."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from h3flow.cli import app
from h3flow.config.adapt import adapt, host_map_of, local_host_map
from h3flow.config.models import HostMap, load_host_map, load_local_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "host-map.example.json"
runner = CliRunner()


def example() -> dict:
    return json.loads(EXAMPLE.read_text())


def write(tmp_path: Path, data: dict | str, name: str = "host-map.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def adapt_cli(*args: str):
    return runner.invoke(app, ["config-adapt", *args])


def test_example_resolves_the_designs_cluster() -> None:
    cfg = adapt(load_host_map(EXAMPLE))
    assert cfg.topology == "four_four_plus_one"
    assert [(p.work_pool, p.role, p.gpus, p.ulysses_degree) for p in cfg.pools] == [
        ("h3-a0", "sample", [0, 1, 2, 3], 4),
        ("h3-a1", "sample", [4, 5, 6, 7], 4),
        ("h3-b", "decode", [0], 1),
    ]
    a0, a1, b = cfg.pools
    assert a0.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and a1.env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert a0.env["H3_MP_RETAIN_CPU_WEIGHTS"] == "1" and "H3_MP_RETAIN_CPU_WEIGHTS" not in b.env
    assert (a0.comfy_url, a1.comfy_url, b.comfy_url) == (
        "http://10.10.0.1:8188",
        "http://10.10.0.1:8189",
        "http://10.10.0.2:8188",
    )
    assert cfg.hosts["host-b"].storage.outputs == "/srv/h3flow/videos"
    assert cfg.hosts["host-a"].storage.latents == "/srv/h3flow/store/latents"
    (route,) = cfg.routes
    assert (route.source, route.target, route.method, route.address, route.port) == (
        "host-a",
        "host-b",
        "tcp",
        "10.10.0.2",
        9410,
    )
    assert [(r.host, r.bind) for r in cfg.receivers] == [("host-b", "10.10.0.2")]


def test_xtx_topology_adds_a_rocm_pool_encoded_on_host_a() -> None:
    cfg = adapt(load_host_map(EXAMPLE), "four_four_xtx_plus_one")
    xtx = cfg.pool("xtx")
    assert xtx.work_pool == "h3-xtx" and xtx.ulysses_degree == 1
    assert xtx.env["HIP_VISIBLE_DEVICES"] == "0" and "CUDA_VISIBLE_DEVICES" not in xtx.env
    assert xtx.encoder_pool == "a0"
    assert {(r.source, r.target) for r in cfg.routes} == {("host-a", "host-b"), ("xtx", "host-b")}


def test_eight_plus_one_is_one_pool_of_degree_8() -> None:
    cfg = adapt(load_host_map(EXAMPLE), "eight_plus_one")
    assert [(p.work_pool, p.ulysses_degree) for p in cfg.samplers] == [("h3-a", 8)]


def test_same_input_gives_byte_identical_output(tmp_path: Path) -> None:
    out1, out2 = tmp_path / "one.json", tmp_path / "two.json"
    assert adapt_cli(str(EXAMPLE), "-o", str(out1)).exit_code == 0
    assert adapt_cli(str(EXAMPLE), "-o", str(out2)).exit_code == 0
    assert out1.read_bytes() == out2.read_bytes()
    assert load_local_config(out1).pools[0].work_pool == "h3-a0"


def test_local_json_round_trips_to_its_host_map() -> None:
    cfg = adapt(load_host_map(EXAMPLE))
    again = adapt(host_map_of(cfg))
    assert again.pools == cfg.pools and again.routes == cfg.routes and again.hosts == cfg.hosts


def test_check_reports_drift_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "local.json"
    assert adapt_cli(str(EXAMPLE), "-o", str(out)).exit_code == 0
    ok = adapt_cli(str(EXAMPLE), "-o", str(out), "--check")
    assert ok.exit_code == 0 and "matches" in ok.output
    changed = example()
    changed["hosts"][2]["address"] = "10.10.0.9"
    before = out.read_bytes()
    res = adapt_cli(str(write(tmp_path, changed)), "-o", str(out), "--check")
    assert res.exit_code == 2
    assert 'hosts.host-b.address: "10.10.0.2" -> "10.10.0.9"' in res.output
    assert out.read_bytes() == before


def test_local_embedded_default(tmp_path: Path) -> None:
    out = tmp_path / "local.json"
    res = adapt_cli("--local", "--workdir", str(tmp_path / "wd"), "-o", str(out), "--base-port", "23400")
    assert res.exit_code == 0, res.output
    cfg = load_local_config(out)
    assert cfg.engine == "local" and cfg.model.kind == "reference"
    assert {h.address for h in cfg.hosts.values()} == {"127.0.0.1"}
    ports = [p.comfy_port for p in cfg.pools] + [
        cfg.transfer.port,
        int(cfg.prefect.api_url.split(":")[2].split("/")[0]),
    ]
    assert len(set(ports)) == len(ports), "local ports clash"
    assert all(h.storage.root.startswith(str((tmp_path / "wd").resolve())) for h in cfg.hosts.values())
    assert [p.work_pool for p in cfg.pools] == ["h3-a0", "h3-a1", "h3-b"]
    assert cfg.routes[0].method == "tcp"  # two hosts on one address still exercise the link


def test_local_skips_ports_in_use(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        hm = local_host_map(tmp_path, base_port=port)
        assert f":{port}/" not in hm.prefect.api_url
        assert all(h.comfy_port != port for h in hm.hosts) and hm.transfer.port != port


def test_local_on_postgresql_gets_its_own_port_and_password_file(tmp_path: Path) -> None:
    config = adapt(local_host_map(tmp_path, base_port=24100, database="postgresql"), work_dir=str(tmp_path))
    database = config.prefect.database
    assert database is not None and database.kind == "postgresql" and config.prefect.auth is None
    assert database.password is not None and database.password.path == str(
        tmp_path.resolve() / "secrets" / "postgres.password"
    )
    others = {config.prefect.api_url.rsplit(":", 1)[1].split("/")[0], str(config.transfer.port)}
    assert str(database.port) not in others
    sqlite = adapt(local_host_map(tmp_path, base_port=24100), work_dir=str(tmp_path)).prefect.database
    assert sqlite is not None and sqlite.kind == "sqlite"


# --------------------------------------------------------------------------- bad input
def mutate(fn) -> dict:
    data = example()
    fn(data)
    return data


BAD_INPUTS = {
    "duplicate host": (lambda d: d["hosts"].append(copy.deepcopy(d["hosts"][0])), "duplicate host name 'host-a'"),
    "repeated gpu": (
        lambda d: d["hosts"][0]["gpus"].__setitem__(1, d["hosts"][0]["gpus"][0]),
        "GPU index 0 is listed twice",
    ),
    "unknown field": (
        lambda d: d["hosts"][1].__setitem__("colour", "red"),
        "hosts[1].colour: Extra inputs are not permitted",
    ),
    "no decoder": (lambda d: d["hosts"].pop(2) and d.__setitem__("links", []), "no host has the 'decode' role"),
    "no sampler": (lambda d: [h.__setitem__("roles", ["decode"]) for h in d["hosts"]], "no host has the 'sample' role"),
    "too few gpus": (
        lambda d: d["hosts"][0].__setitem__("gpus", d["hosts"][0]["gpus"][:6]),
        "needs 8 GPUs on 'host-a', which has 6",
    ),
    "too little vram": (lambda d: d["model"].__setitem__("dit_vram_gb", 80), "needs 80 GB"),
    "bad arch": (lambda d: d["hosts"][0]["gpus"][0].__setitem__("arch", "turing"), "unknown GPU architecture 'turing'"),
    "unknown link host": (lambda d: d["links"][0].__setitem__("hosts", ["host-a", "host-z"]), "unknown host 'host-z'"),
    # hostile values (issue 16): each refused at config-adapt, not when a service starts
    "api url without host": (
        lambda d: d["prefect"].__setitem__("api_url", "http://"),
        "prefect.api_url: 'http://' is not an http(s) URL with a host",
    ),
    "api url bad port": (lambda d: d["prefect"].__setitem__("api_url", "http://h:99999/api"), "Port out of range"),
    "api url not http": (lambda d: d["prefect"].__setitem__("api_url", "ftp://h/api"), "is not an http(s) URL"),
    "cron out of range": (
        lambda d: d["prefect"]["schedule"].__setitem__("cron", "99 99 99 99 99"),
        "'99 99 99 99 99' is not a cron schedule (Bad minute)",
    ),
    "unknown time zone": (
        lambda d: d["prefect"]["schedule"].__setitem__("timezone", "Mars/Olympus"),
        "unknown time zone 'Mars/Olympus'",
    ),
    "time zone path": (
        lambda d: d["prefect"]["schedule"].__setitem__("timezone", "../../etc/passwd"),
        "unknown time zone '../../etc/passwd'",
    ),
    "nul in a store root": (
        lambda d: d["hosts"][0]["storage"].__setitem__("root", "/srv/h3\x00flow"),
        "hosts[0].storage.root: '/srv/h3\\x00flow' contains a control character ('\\x00')",
    ),
    "newline in a venv": (lambda d: d["hosts"][1].__setitem__("venv", "/opt/v\nenv"), "contains a control character"),
    "control character in an inbox": (
        lambda d: d["prefect"]["schedule"].__setitem__("inbox", "/srv/in\x1bbox"),
        "contains a control character ('\\x1b')",
    ),
    "empty env name": (
        lambda d: d["hosts"][0].__setitem__("env", {"": "1"}),
        "env name '' is not a variable name",
    ),
    "env name with =": (
        lambda d: d["hosts"][0].__setitem__("env", {"A=B": "1"}),
        "env name 'A=B' is not a variable name",
    ),
    "nul in an env value": (
        lambda d: d["hosts"][0].__setitem__("env", {"A": "x\x00y"}),
        "contains a control character",
    ),
    "LD_PRELOAD": (lambda d: d["hosts"][0].__setitem__("env", {"LD_PRELOAD": "/tmp/x.so"}), "env LD_PRELOAD: loader"),
    "LD_LIBRARY_PATH": (
        lambda d: d["hosts"][2].__setitem__("env", {"LD_LIBRARY_PATH": "/opt/rocm/lib"}),
        "env LD_LIBRARY_PATH: loader",
    ),
    "PYTHONPATH": (lambda d: d["hosts"][1].__setitem__("env", {"PYTHONPATH": "/tmp"}), "env PYTHONPATH: loader"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_host_maps_fail_in_one_line_and_write_nothing(tmp_path: Path, case: str) -> None:
    fn, message = BAD_INPUTS[case]
    out = tmp_path / "local.json"
    res = adapt_cli(str(write(tmp_path, mutate(fn))), "-o", str(out))
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert res.output.count("\n") <= 2 and "Traceback" not in res.output
    assert not out.exists()


def test_output_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    res = adapt_cli(str(EXAMPLE), "-o", str(tmp_path))
    assert res.exit_code == 2
    assert res.output == f"error: -o {tmp_path} is a directory: name the file, e.g. -o {tmp_path / 'local.json'}\n"
    assert list(tmp_path.iterdir()) == []


def test_malformed_json_names_line_and_column(tmp_path: Path) -> None:
    res = adapt_cli(str(write(tmp_path, '{\n  "version": 1,\n  "hosts": [,]\n}')), "-o", str(tmp_path / "o.json"))
    assert res.exit_code == 2
    assert "invalid JSON at line 3, column 13" in res.output


def test_bad_topology_and_missing_file(tmp_path: Path) -> None:
    res = adapt_cli(str(EXAMPLE), "--topology", "three_ring", "-o", str(tmp_path / "o.json"))
    assert res.exit_code == 2 and "unknown topology 'three_ring'" in res.output
    res = adapt_cli(str(EXAMPLE), "--topology", "4+3", "-o", str(tmp_path / "o.json"))
    assert res.exit_code == 2 and "not a Ulysses degree" in res.output
    res = adapt_cli(str(tmp_path / "nope.json"))
    assert res.exit_code == 2 and "no such file" in res.output


def test_existing_output_survives_a_failed_adapt(tmp_path: Path) -> None:
    out = tmp_path / "local.json"
    assert adapt_cli(str(EXAMPLE), "-o", str(out)).exit_code == 0
    before = out.read_bytes()
    bad = mutate(BAD_INPUTS["too few gpus"][0])
    assert adapt_cli(str(write(tmp_path, bad)), "-o", str(out)).exit_code == 2
    assert out.read_bytes() == before


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70000) | st.floats(allow_nan=False, width=32) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


ALL_PATHS = [p for p in _paths(example()) if p]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(ALL_PATHS), value=json_values, delete=st.booleans())
def test_fuzzed_host_maps_never_give_a_traceback(tmp_path: Path, path, value, delete: bool) -> None:
    data = example()
    node = data
    for key in path[:-1]:
        node = node[key]
    if delete and isinstance(node, dict):
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    res = adapt_cli(str(write(tmp_path, data)), "-o", str(tmp_path / "fuzz.json"))
    assert res.exit_code in (0, 2), res.output
    if res.exit_code == 2:
        assert res.exception is None or isinstance(res.exception, SystemExit)
        assert "Traceback" not in res.output and res.output.startswith("error:")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=60))
def test_fuzzed_bytes_never_give_a_traceback(tmp_path: Path, text: str) -> None:
    res = adapt_cli(str(write(tmp_path, text)), "-o", str(tmp_path / "fuzz.json"))
    assert res.exit_code in (0, 2)
    assert res.exception is None or isinstance(res.exception, SystemExit)


CONTROL = st.characters(min_codepoint=0, max_codepoint=31) | st.just("\x7f")
TEXT_FIELDS = [
    ("hosts", 0, "storage", "root"),
    ("hosts", 0, "venv"),
    ("hosts", 1, "comfy_dir"),
    ("hosts", 2, "address"),
    ("hosts", 2, "storage", "outputs"),
    ("prefect", "schedule", "inbox"),
    ("runs_dir",),
]


def set_path(data: dict, path: tuple, value: object) -> None:
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(TEXT_FIELDS), before=st.text(max_size=6), bad=CONTROL, after=st.text(max_size=6))
def test_a_control_character_in_any_path_is_refused(
    tmp_path: Path, field: tuple, before: str, bad: str, after: str
) -> None:
    data = example()
    set_path(data, field, f"/srv/{before}{bad}{after}")
    out = tmp_path / "fuzz.json"
    out.unlink(missing_ok=True)
    res = adapt_cli(str(write(tmp_path, data)), "-o", str(out))
    assert res.exit_code == 2, res.output
    assert "contains a control character" in res.output and res.output.count("\n") == 1
    assert not out.exists()


# what decides the code or programs a service runs (issue 16; PATH and the shell's start-up
# variables since issue 23)
LOADERS = {"PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONEXECUTABLE"}
LOADERS |= {"PYTHONINSPECT", "PYTHONBREAKPOINT", "PYTHONPLATLIBDIR", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS"}
LOADERS |= {"IFS", "GCONV_PATH", "HOSTALIASES"}


@settings(max_examples=80, deadline=None)
@given(name=st.text(max_size=12) | st.sampled_from(sorted(LOADERS)), value=st.text(max_size=12))
def test_env_names_are_variable_names_and_never_loader_variables(name: str, value: str) -> None:
    import re

    from pydantic import ValidationError

    data = example()
    data["hosts"][0]["env"] = {name: value}
    ok_name = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) is not None
    loader = name in LOADERS or name.startswith(("LD_", "DYLD_"))
    clean = not any(ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) < 0xE000 for c in name + value)
    try:
        HostMap.model_validate(data)
        accepted = True
    except ValidationError:
        accepted = False
    assert accepted == (ok_name and not loader and clean)


@settings(max_examples=80, deadline=None)
@given(
    fields=st.lists(
        st.one_of(
            st.integers(-5, 70).map(str),
            st.sampled_from(["*", "*/5", "1-3", "mon", "jan", "L", "?", ""]),
            st.text(alphabet="0123456789*/-,", min_size=1, max_size=4),
        ),
        min_size=4,
        max_size=6,
    )
)
def test_cron_schedules_are_checked_like_prefect_does(fields: list[str]) -> None:
    """Whatever config-adapt accepts, Prefect's own cron check (croniter) accepts too."""
    from prefect._internal.schemas.validators import validate_cron_string
    from pydantic import ValidationError

    cron = " ".join(fields)
    data = example()
    data["prefect"]["schedule"]["cron"] = cron
    try:
        HostMap.model_validate(data)
    except ValidationError:
        return
    validate_cron_string(cron)  # raises if Prefect would refuse the deployment's schedule


def test_help_lists_the_operators_commands() -> None:
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0
    for command in ["config-adapt", "plan", "preflight", "start", "run", "wait", "resume", "patches", "nodes", "demo"]:
        assert command in res.output


def test_hostmap_model_is_the_schema() -> None:
    schema = HostMap.model_json_schema()
    assert schema["additionalProperties"] is False and "hosts" in schema["required"]


def test_a_cluster_gets_postgresql_and_an_api_credential_the_embedded_default_neither(tmp_path: Path) -> None:
    example = adapt(load_host_map(EXAMPLE))  # its transfer secret comes from the environment: so do these
    assert example.prefect.database is not None and example.prefect.database.kind == "postgresql"
    assert example.prefect.database.password is not None
    assert (example.prefect.database.password.source, example.prefect.database.password.name) == (
        "env",
        "H3FLOW_POSTGRES_PASSWORD",
    )
    assert example.prefect.auth is not None
    assert (example.prefect.auth.source, example.prefect.auth.name) == ("env", "H3FLOW_PREFECT_AUTH")
    raw = json.loads(EXAMPLE.read_text())
    raw["transfer"]["secret"] = {"source": "file", "path": "/etc/h3flow/secrets/transfer.key"}
    filed = adapt(HostMap.model_validate(raw))
    assert filed.prefect.auth is not None and filed.prefect.auth.path == "/etc/h3flow/secrets/prefect-api.auth"
    assert filed.prefect.database is not None and filed.prefect.database.password is not None
    assert filed.prefect.database.password.path == "/etc/h3flow/secrets/postgres.password"
    assert adapt(host_map_of(filed)).prefect == filed.prefect  # the resolved values survive a round trip
    raw["prefect"]["database"] = {"kind": "sqlite"}
    assert adapt(HostMap.model_validate(raw)).prefect.database.kind == "sqlite"  # type: ignore[union-attr]
    raw["prefect"]["auth"] = {"source": "prefect-secret", "name": "x"}
    with pytest.raises(ValueError, match="can be read by anyone who reaches the API"):
        HostMap.model_validate(raw)
    local = adapt(local_host_map(tmp_path), work_dir=str(tmp_path))
    assert local.prefect.database is not None and local.prefect.database.kind == "sqlite"
    assert local.prefect.auth is None
