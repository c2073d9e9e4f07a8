"""Property-based tests of every parser that reads hostile input, with hypothesis.

Two hypothesis profiles: `suite` (bounded, derandomized, part of `make test`) and `fuzz` (the
long campaign of `make fuzz` / `python -m tests.fuzz`, fresh random inputs each run).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much, HealthCheck.large_base_example]

#: Examples per target in the suite; all targets together stay well under a minute.
SUITE_EXAMPLES = 100

settings.register_profile("suite", max_examples=SUITE_EXAMPLES, deadline=None, derandomize=True, database=None,
                          suppress_health_check=_QUIET, print_blob=True)
settings.register_profile("fuzz", deadline=None, database=None, suppress_health_check=_QUIET, report_multiple_bugs=False)
