"""Every docstring example in the package runs and holds."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

LAYERS = ["control", "learners", "telemetry", "storage", "dashboard"]


def _modules() -> list[str]:
    names = []
    for layer in LAYERS:
        package = importlib.import_module(f"steersman.{layer}")
        for info in pkgutil.walk_packages(package.__path__, f"steersman.{layer}."):
            if ".migrations" not in info.name:  # Alembic scripts run only under Alembic
                names.append(info.name)
    return names


@pytest.mark.parametrize("name", _modules())
def test_doctests(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
