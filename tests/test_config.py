"""jax_trn.config: every JAX_TRN_* setting read once, validated, with errors that name it."""
from __future__ import annotations

import dataclasses

import pytest

from jax_trn import config, systems
from jax_trn.config import ConfigError, Options, resolve

from tests.conftest import run_python


@pytest.fixture
def fresh(monkeypatch):
    """config's process state as if no backend had started and nothing was configured."""
    monkeypatch.setattr(config, "_live", None)
    monkeypatch.setattr(config, "_configured", {})


def test_defaults_without_environment(fresh):
    assert resolve(environ={}) == Options()
    assert Options().system.name == "trn2.3xlarge"
    assert Options().max_while_iterations == 10000


def test_every_setting_has_a_variable_and_a_field():
    fields = {f.name for f in dataclasses.fields(Options)}
    assert {s.field for s in config.SETTINGS} == fields
    assert {s.variable for s in config.SETTINGS} >= {
        "JAX_TRN_SYSTEM", "JAX_TRN_MATMUL_PRECISION", "JAX_TRN_DUMP",
        "JAX_TRN_DISABLE_PASSES", "JAX_TRN_STOCHASTIC_ROUNDING",
        "JAX_TRN_STOCHASTIC_ROUNDING_SEED", "JAX_TRN_STRICT_ACTIVATION_RANGES",
        "JAX_TRN_COLLECTIVE_ALGORITHM", "JAX_TRN_MAX_WHILE_ITERATIONS"}


def test_values_are_parsed(fresh, tmp_path):
    o = resolve(environ={"JAX_TRN_SYSTEM": "trn1.2xlarge",
                         "JAX_TRN_MATMUL_PRECISION": "TensorFloat32",
                         "JAX_TRN_DUMP": str(tmp_path / "dumps"),
                         "JAX_TRN_DISABLE_PASSES": " cse, dce ",
                         "JAX_TRN_STOCHASTIC_ROUNDING": "yes",
                         "JAX_TRN_STOCHASTIC_ROUNDING_SEED": "42",
                         "JAX_TRN_STRICT_ACTIVATION_RANGES": "0",
                         "JAX_TRN_COLLECTIVE_ALGORITHM": "ring",
                         "JAX_TRN_MAX_WHILE_ITERATIONS": "5",
                         "JAX_TRN_SIMULATOR_THREADS": "1"})
    assert o.system is systems.SYSTEMS["trn1.2xlarge"]
    assert o.matmul_precision == "high"
    assert o.dump == str(tmp_path / "dumps") and (tmp_path / "dumps").is_dir()
    assert o.disable_passes == {"cse", "dce"}
    assert o.stochastic_rounding and o.stochastic_rounding_seed == 42
    assert not o.strict_activation_ranges
    assert o.collective_algorithm == "ring"
    assert o.max_while_iterations == 5
    assert o.simulator_threads == 1


@pytest.mark.parametrize("var, value, says", [
    ("JAX_TRN_MAX_WHILE_ITERATIONS", "lots", "integer >= 1"),
    ("JAX_TRN_MAX_WHILE_ITERATIONS", "0", "integer >= 1"),
    ("JAX_TRN_SIMULATOR_THREADS", "3", "1 or 2"),
    ("JAX_TRN_STOCHASTIC_ROUNDING_SEED", "-3", "integer >= 0"),
    ("JAX_TRN_STOCHASTIC_ROUNDING", "maybe", "expected one of 1, true"),
    ("JAX_TRN_MATMUL_PRECISION", "fp64", "default, bfloat16, high"),
    ("JAX_TRN_SYSTEM", "trn2.48xlage", "did you mean 'trn2.48xlarge'"),
    ("JAX_TRN_DISABLE_PASSES", "nosuchpass", "unknown pass nosuchpass; passes: "),
    ("JAX_TRN_COLLECTIVE_ALGORITHM", "carrier-pigeon", "auto or one of ring"),
])
def test_bad_values_name_the_variable_and_what_it_accepts(fresh, var, value, says):
    with pytest.raises(ConfigError) as e:
        resolve(environ={var: value})
    assert f"{var}={value!r}" in str(e.value)
    assert says in str(e.value)


def test_dump_naming_a_file_is_a_clear_error(fresh, tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="JAX_TRN_DUMP=.*exists and is not a directory"):
        resolve(environ={"JAX_TRN_DUMP": str(f)})


def test_unknown_variable_warns_with_a_suggestion(fresh):
    with pytest.warns(UserWarning, match="JAX_TRN_SYTEM is not a jax-trn setting; did you "
                                         "mean JAX_TRN_SYSTEM"):
        resolve(environ={"JAX_TRN_SYTEM": "trn1.2xlarge"})


def test_configure_takes_precedence_over_the_environment(fresh):
    config.configure(system="trn1.2xlarge", matmul_precision="highest")
    o = resolve(environ={"JAX_TRN_SYSTEM": "trn2.48xlarge", "JAX_TRN_MATMUL_PRECISION": "high"})
    assert o.system.name == "trn1.2xlarge" and o.matmul_precision == "highest"
    assert config.get_system().name == "trn1.2xlarge"


def test_configure_validates_at_once(fresh):
    with pytest.raises(ConfigError, match="max_while_iterations"):
        config.configure(max_while_iterations="lots")
    with pytest.raises(ConfigError, match="no such jax-trn setting"):
        config.configure(sytem="trn1.2xlarge")


def test_configure_takes_a_system_object(fresh):
    custom = dataclasses.replace(systems.SYSTEMS["trn1.2xlarge"], name="my-trn1")
    config.configure(system=custom)
    assert config.get_system() is custom


def test_configure_after_start_refuses_changes(fresh):
    config.start({})
    live = config.live()
    assert config.get_system() is live.system
    config.configure(system=live.system.name)            # the same: nothing to change
    other = "trn1.2xlarge" if live.system.name != "trn1.2xlarge" else "trn2.3xlarge"
    with pytest.raises(RuntimeError, match="already started with system=.*configure\\(system"):
        config.configure(system=other)
    assert config.get_system() is live.system


def test_per_program_compile_options(fresh):
    o = Options()
    assert config.for_compile(o, {"jax_trn_matmul_precision": "float32",
                                  "xla_something_else": True}).matmul_precision == "highest"
    assert config.for_compile(o, {}) is o
    with pytest.raises(ConfigError, match="not a per-program jax-trn setting"):
        config.for_compile(o, {"jax_trn_system": "trn1.2xlarge"})


def test_bad_variable_fails_the_backend_start_naming_it():
    r = run_python("import jax\ntry:\n    jax.devices('trn')\nexcept RuntimeError as e:\n"
                   "    print('ERROR', e)\n", env={"JAX_TRN_MAX_WHILE_ITERATIONS": "lots"})
    assert r.returncode == 0, r.stderr
    assert "ERROR" in r.stdout and "JAX_TRN_MAX_WHILE_ITERATIONS='lots'" in r.stdout


def test_configure_after_the_backend_started_says_why():
    r = run_python(
        "import jax, jax_trn\njax.devices('trn')\n"
        "try:\n    jax_trn.configure(system='trn1.2xlarge')\n"
        "except RuntimeError as e:\n    print('ERROR', e)\n"
        "print('SYSTEM', jax_trn.get_system().name, len(jax.devices('trn')))\n",
        env={"JAX_TRN_SYSTEM": "trn2.3xlarge"})
    assert r.returncode == 0, r.stderr
    assert "ERROR the trn backend has already started" in r.stdout
    assert "SYSTEM trn2.3xlarge 8" in r.stdout


def test_compile_time_settings_per_program(jax, trn):
    import numpy as np
    x = jax.device_put(np.random.RandomState(0).randn(64, 64).astype(np.float32), trn)
    ref = np.asarray(x, np.float64) @ np.asarray(x, np.float64)
    f = jax.jit(lambda a: a @ a)
    default = np.asarray(f.lower(x).compile()(x))
    exact = np.asarray(f.lower(x).compile({"jax_trn_matmul_precision": "highest"})(x))
    assert np.abs(default - ref).max() > 1e-2          # bf16 operands
    assert np.abs(exact - ref).max() < 1e-4            # fp32
    with pytest.raises(Exception, match="'jax_trn_system' is not a per-program"):
        f.lower(x).compile({"jax_trn_system": "trn1.2xlarge"})


@pytest.mark.parametrize("overrides,says", [
        ({"invalid_key": "x"}, "No such compile option: 'invalid_key'"),
        ({"exec_time_compilation_effort": 0.0}, "No such compile option"),
        ({"xla_embed_ir_in_executable": "invalid_value"}, "is not a valid bool value"),
])
def test_xla_compile_options_are_checked_as_xla_checks_them(overrides, says):
    """JAX's own tests expect XLA's errors for a misspelt compiler option (they were
    ignored); XLA's real options and its build options pass."""
    options = resolve({})
    with pytest.raises(ConfigError, match=says):
        config.for_compile(options, overrides)
    assert config.for_compile(options, {"xla_embed_ir_in_executable": True,
                                        "exec_time_optimization_effort": 0.0}) == options
