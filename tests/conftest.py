"""Shared pytest configuration. Hypothesis runs a fixed, CI-sized number of examples with no deadline."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.load_profile("default")
