"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sshd import SshServer, sshd_unavailable, start_sshd  # tests/ is on sys.path (rootdir conftest)

from h3flow.config.models import LocalConfig, load_local_config


# --------------------------------------------------------------------------- real sshd
@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """A real Debian openssh-server on a free loopback port (see tests/sshd.py): keys,
    known_hosts and an ssh config with the alias ``h3test`` in ``sshd.config``."""
    reason = sshd_unavailable()
    if reason:
        pytest.skip(reason)
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


# --------------------------------------------------------------------------- a real Prefect server
@dataclass
class PrefectServer:
    config_path: Path

    @property
    def config(self) -> LocalConfig:
        return load_local_config(self.config_path)


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """The embedded default's Prefect server alone (no workers), started by h3flow's service code."""
    from cluster import quiet
    from test_cli import make_config

    from h3flow.ops.lifecycle import bring_down, bring_up, runners
    from h3flow.ops.services import service_specs

    path = make_config(tmp_path_factory.mktemp("prefect") / "wd")
    config = load_local_config(path)
    specs = [s for s in service_specs(config, path) if s.kind == "prefect-server"]
    with runners(config) as runner_for:
        bring_up(specs, runner_for, timeout=180, console=quiet)
        try:
            yield PrefectServer(path)
        finally:
            bring_down(specs, runner_for, console=quiet)
