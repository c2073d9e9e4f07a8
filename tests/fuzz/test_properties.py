"""Every fuzz target, briefly (profile `suite`: derandomized, bounded): never an exception other
than the documented one, whatever the input. `make fuzz` runs the same targets for minutes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings

from tests.fuzz.targets import TARGETS, Target


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_target_holds(target: Target) -> None:
    with target.open() as check:
        @settings(settings.get_profile("suite"))
        @given(target.strategy)
        def holds(value: Any) -> None:
            check(value)

        holds()
