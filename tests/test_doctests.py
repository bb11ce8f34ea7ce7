"""Every docstring example in the package runs and holds."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

LAYERS = ["control", "learners", "telemetry", "storage", "dashboard"]
# Imports vllm, which lives in its own environment: its doctests run there (tests/control/backends
# /test_vllm_scheduler.py).
IN_VLLM_ENV = {"steersman.control.backends.vllm_scheduler"}


def _modules() -> list[str]:
    names = []
    for layer in LAYERS:
        package = importlib.import_module(f"steersman.{layer}")
        for info in pkgutil.walk_packages(package.__path__, f"steersman.{layer}."):
            # Alembic scripts run only under Alembic.
            if ".migrations" in info.name or info.name in IN_VLLM_ENV:
                continue
            names.append(info.name)
    return names


@pytest.mark.parametrize("name", _modules())
def test_doctests(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
