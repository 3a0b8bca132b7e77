"""Test-wide settings."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

# Hypothesis profiles: the default is seeded and modest so CI is deterministic and fast;
# `pytest --hypothesis-profile=long` walks the same properties much further.
settings.register_profile("default", max_examples=30, derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("default")
