"""Shared pytest configuration: Hypothesis profiles.

"ci" (the default): derandomized, so a CI run is reproducible; 300 examples
per property (tests/test_properties.py spreads them over its parametrisations);
no deadline (kernels compile on first use); print_blob so a failure prints the
reproduction blob.  "dev": 10x the examples, randomized.  Select with
HYPOTHESIS_PROFILE=dev.
"""
import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, max_examples=300, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", derandomize=False, max_examples=3000, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
