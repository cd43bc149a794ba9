"""Builds the one native piece of the plugin: its trampolines, PJRT_Errors and the calls
answered without Python (pjrt_plugin/_native/_guard.c, _answers.c). Everything else is
configured in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("pjrt_plugin._native._guard",
                             ["pjrt_plugin/_native/_guard.c", "pjrt_plugin/_native/_answers.c"],
                             depends=["pjrt_plugin/_native/_native.h"], optional=True)])
