"""Shared fixtures: the trn devices and JAX's CPU backend for reference results."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

# 8 host devices, so that multi-device programs have a CPU reference on the same mesh
# (tests/multichip). Set before JAX starts its CPU backend.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()


@pytest.fixture(scope="session")
def jax():
    import jax
    return jax


@pytest.fixture(scope="session")
def trn_devices(jax):
    return jax.devices("trn")


@pytest.fixture(scope="session")
def trn(trn_devices):
    return trn_devices[0]


@pytest.fixture(scope="session")
def cpu(jax):
    return jax.devices("cpu")[0]


def run_python(code: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (a new JAX backend) and returns the result."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


def assert_close(actual, expected, dtype: str, rtol: float | None = None, atol: float | None = None):
    """Compares against the CPU backend with tolerances that follow the dtype."""
    tol = {"bfloat16": (2e-2, 2e-2), "float16": (2e-3, 2e-3), "float32": (2e-5, 1e-6),
           "float8_e4m3fn": (1.3e-1, 1e-1), "float8_e5m2": (2.6e-1, 2e-1)}
    r, a = tol.get(dtype, (0, 0))
    np.testing.assert_allclose(np.asarray(actual).astype(np.float64) if dtype != "bool" else np.asarray(actual),
                               np.asarray(expected).astype(np.float64) if dtype != "bool" else np.asarray(expected),
                               rtol=r if rtol is None else rtol, atol=a if atol is None else atol)
