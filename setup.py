"""Packages are discovered, not listed: every folder with an ``__init__.py`` under the project's
top-level folders installs as ``steersman.<folder>...`` (metadata is in pyproject.toml)."""

from setuptools import find_packages, setup

ROOTS = ("control", "learners", "telemetry", "storage", "dashboard", "data")

package_dir = {f"steersman.{root}": root for root in ROOTS}
packages = [
    f"steersman.{root}{'.' + sub if sub else ''}"
    for root in ROOTS
    for sub in ("", *find_packages(root))
]

setup(package_dir=package_dir, packages=packages)
