"""Builds the one native piece of the plugin: exception-safe trampolines
(pjrt_plugin/_guard.c). Everything else is configured in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("pjrt_plugin._guard", ["pjrt_plugin/_guard.c"], optional=True)])
