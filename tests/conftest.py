"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sshd import SshServer, sshd_unavailable, start_sshd  # tests/ is on sys.path (rootdir conftest)


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
