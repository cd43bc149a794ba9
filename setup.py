"""Builds the one native piece of the plugin: its trampolines and PJRT_Errors
(pjrt_plugin/_native/_guard.c). Everything else is configured in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("pjrt_plugin._native._guard", ["pjrt_plugin/_native/_guard.c"],
                             optional=True)])
