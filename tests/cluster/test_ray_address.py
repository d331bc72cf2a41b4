"""An unreachable --ray-address fails at once, naming it: ray.init retried an address no process serves for minutes,
printing its own logs, before it failed."""

from __future__ import annotations

import socket

import pytest

from radixcache.runtime.cluster.placement import check_reachable


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the block ends: nobody listens there


@pytest.mark.parametrize("form", ["127.0.0.1:{}", "ray://127.0.0.1:{}", "localhost:{}"])
def test_an_address_nobody_serves_is_a_connection_error_naming_it(form: str) -> None:
    address = form.format(_closed_port())
    with pytest.raises(ConnectionError, match=f"cannot reach the Ray cluster at {address}"):
        check_reachable(address, timeout=2)


def test_a_listening_address_and_rays_own_forms_pass() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}", timeout=2)
    for address in (None, "auto", "local"):
        check_reachable(address)


@pytest.mark.parametrize("command", ["replay", "serve"])
@pytest.mark.parametrize("address", ["", "  "])
def test_an_empty_address_is_a_usage_error_naming_the_flag(command: str, address: str, tiny_dir) -> None:
    """Regression: `--ray-address ""` reached ray.init, whose error ("Invalid address format:") named no flag."""
    from click.testing import CliRunner

    from radixcache.cli.main import main

    args = [command, "--model", str(tiny_dir), "--replicas", "2", "--ray-address", address]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 2, out.output
    assert "--ray-address" in out.output and "empty address" in out.output
    with pytest.raises(ValueError, match="the Ray address is empty"):
        check_reachable(address)
