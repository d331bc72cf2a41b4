"""`radixcache serve --retain-for` is checked before any model loads: a bad value exits non-zero naming the option;
good ones become create_app's lease_defaults."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from radixcache.cli.main import main
from radixcache.runtime.server.leases import lease_usage, parse_lease_defaults, retain_for


@pytest.mark.parametrize("bad", ["-5", "nan", "inf", "abc", "sk-a=", "sk-a=1e9", "=3"])
def test_a_bad_retain_for_is_refused_before_the_model_loads(bad: str) -> None:
    result = CliRunner().invoke(main, ["serve", "--model", "no-such-model", "--retain-for", bad, "--port", "0"])
    assert result.exit_code != 0
    assert "--retain-for" in result.output or "retain_for" in result.output, result.output


@pytest.mark.parametrize("keys", [[], ["--api-key", "sk-a"]])
def test_a_retain_for_key_no_api_key_gives_is_refused(keys: list[str]) -> None:
    """`--retain-for sk-b=30` without `--api-key sk-b` (a typo, or no keys at all) was taken and never applied."""
    serve = ["serve", "--model", "no-such-model", "--port", "0"]
    result = CliRunner().invoke(main, [*serve, *keys, "--retain-for", "sk-b=30"])
    assert result.exit_code == 2 and "names a key that no --api-key gives" in result.stderr, result.output
    ok = CliRunner().invoke(main, [*serve, "--api-key", "sk-b", "--retain-for", "sk-b=30", "--retain-for", "5"])
    assert "no-such-model" in ok.stderr  # past the options, to the model


def test_defaults_by_key_and_for_everyone() -> None:
    defaults = parse_lease_defaults(["sk-a=60", "5", "sk-b=0"])
    assert defaults == {"sk-a": 60.0, "*": 5.0}  # a zero default is no lease
    assert retain_for(None, "sk-a", defaults) == 60.0
    assert retain_for(None, "sk-b", defaults) == 5.0 and retain_for(None, None, defaults) == 5.0
    assert retain_for(2.0, "sk-a", defaults) == 2.0 and retain_for(0.0, "sk-a", defaults) == 0.0
    assert retain_for(None, "sk-a", {}) is None
    assert lease_usage([]) is None
    assert not math.isnan(defaults["*"])
