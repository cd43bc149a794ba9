"""Options: every `JAX_TRN_*` setting, read once, validated, passed down as one object.

The environment is read here and nowhere else (tests/test_layering.py checks it). When
the `trn` backend starts (JAX creates the PJRT client), `resolve()` builds one frozen
`Options` from, in order of precedence:

    jax_trn.configure(...)           # before the backend starts
    the PJRT client create options   # jax's register_plugin(options=...), if any
    the JAX_TRN_* environment variables
    the defaults below

and `start()` records it as the live options of the process. The compiler, the runtime
and the hardware model get what they need from it as arguments; none of them looks at
the environment or at a global again. A bad value fails the backend's start with an
error that names the variable and the accepted values.

Compile-time settings can also be given per program, as JAX compiler options:

    jax.jit(f).lower(x).compile({"jax_trn_matmul_precision": "highest"})

(`for_compile()` applies them on top of the live options).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import os
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jax_trn import systems
from jax_trn.hw import sgemm as _sgemm
from jax_trn.systems import System

PREFIX = "JAX_TRN_"


class ConfigError(ValueError):
    """A setting with a value jax-trn does not accept; the message names the setting."""


# --- parsers: text (from the environment) or a Python value (from configure) -> value -----

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"expected one of {', '.join(_TRUE)} or {', '.join(_FALSE[:-1])}")


def _integer(minimum: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        try:
            n = int(str(value).strip()) if not isinstance(value, int) else value
        except ValueError:
            raise ValueError(f"expected an integer >= {minimum}") from None
        if isinstance(n, bool) or n < minimum:
            raise ValueError(f"expected an integer >= {minimum}")
        return n
    return parse


def _seconds(value: Any) -> float:
    try:
        x = float(str(value).strip()) if not isinstance(value, (int, float)) else float(value)
    except ValueError:
        raise ValueError("expected a number of seconds > 0") from None
    if isinstance(value, bool) or not x > 0 or x != x or x == float("inf"):
        raise ValueError("expected a number of seconds > 0")
    return x


# What precision=DEFAULT means for float32 dot_general (README "Settings"): the canonical
# names and the spellings JAX's own `jax_default_matmul_precision` accepts.
PRECISIONS = {"default": "default", "bfloat16": "default", "high": "high",
              "tensorfloat32": "high", "highest": "highest", "float32": "highest"}


def _threads(value: Any) -> int:
    n = _integer(1)(value)
    if n > 2:
        raise ValueError("expected 1 or 2")
    return n


def _precision(value: Any) -> str:
    try:
        return PRECISIONS[str(value).strip().lower()]
    except KeyError:
        raise ValueError(f"expected one of {', '.join(PRECISIONS)}") from None


def _system(value: Any) -> System:
    if isinstance(value, System):
        return value
    name = str(value).strip()
    if name in systems.SYSTEMS:
        return systems.SYSTEMS[name]
    close = difflib.get_close_matches(name, list(systems.SYSTEMS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown Trainium system{hint}; expected one of {', '.join(systems.SYSTEMS)}, "
                     "or a jax_trn.systems.System object given to configure()")


def _pass_names(value: Any) -> frozenset[str]:
    names = value.split(",") if isinstance(value, str) else list(value)
    names = frozenset(n.strip() for n in names if n.strip())
    from hlo_passes import pass_names
    valid = pass_names()
    unknown = sorted(names - set(valid))
    if unknown:
        raise ValueError(f"unknown pass{'es' if len(unknown) > 1 else ''} "
                         f"{', '.join(unknown)}; passes: {', '.join(valid)}")
    return names


def _dump_dir(value: Any) -> str | None:
    """A directory for IR dumps: created if missing; an existing file or an unwritable
    directory is an error now, not an internal error in the middle of a compile."""
    if value is None or str(value).strip() == "":
        return None
    path = os.path.abspath(os.path.expanduser(str(value)))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{path} exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create directory {path}: {e.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"directory {path} is not writable")
    return path


def _algorithm(value: Any) -> str | None:
    if value is None or str(value).strip().lower() in ("", "auto"):
        return None
    from jax_trn.collectives import ALGORITHMS
    name = str(value).strip().lower()
    if name not in ALGORITHMS:
        raise ValueError(f"expected auto or one of {', '.join(ALGORITHMS)}")
    return name


def _coretype(value: Any) -> str:
    text = str(value).strip()
    if text.lower() in ("", "auto"):
        return "auto"
    if not text.replace("_", "").isalnum():
        raise ValueError("expected auto or an OpenBLAS core name such as Haswell or SkylakeX")
    return text


# --- the settings ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Setting:
    field: str
    parse: Callable[[Any], Any]
    help: str
    compile_time: bool = False      # may be given per program as a JAX compiler option

    @property
    def variable(self) -> str:
        return PREFIX + self.field.upper()


SETTINGS: tuple[Setting, ...] = (
    Setting("system", _system, "system preset (README: Systems)"),
    Setting("matmul_precision", _precision,
            "what precision=DEFAULT means for float32 matmuls: default (bf16 operands, "
            "FP32 accumulation), high (tf32), highest (fp32)", compile_time=True),
    Setting("dump", _dump_dir, "directory for the IR after every compiler pass",
            compile_time=True),
    Setting("disable_passes", _pass_names, "compiler passes to skip, by name (a,b)",
            compile_time=True),
    Setting("stochastic_rounding", _flag, "stochastic rounding on engine outputs"),
    Setting("stochastic_rounding_seed", _integer(0), "seed of the stochastic rounding"),
    Setting("strict_activation_ranges", _flag,
            "NaN for ScalarE function inputs outside their published ranges"),
    Setting("collective_algorithm", _algorithm,
            "force a collective algorithm instead of the size rule", compile_time=True),
    Setting("max_while_iterations", _integer(1),
            "trip count at which a while loop is stopped as a runaway", compile_time=True),
    Setting("simulator_threads", _threads,
            "threads for kernel numerics: 2 lets a worker thread take part of each "
            "kernel (results bit-identical); 1 runs them in order, for a machine whose "
            "second core is busy"),
    Setting("blas_coretype", _coretype,
            "OpenBLAS kernel of the simulator's FP32 products (jax_trn/hw/sgemm.py): "
            "auto (AVX-512 where the CPU has it) or a core name such as Haswell; read "
            "once, when the process's first product runs"),
    Setting("process_timeout", _seconds,
            "seconds a process of a multi-process run (jax.distributed) waits for the "
            "others' data at a collective before it fails (a peer that died, hangs or "
            "took another path through the program)"),
)
_BY_FIELD = {s.field: s for s in SETTINGS}


@dataclass(frozen=True)
class Options:
    """Every setting of one `trn` client. Built by `resolve()`; fields are validated."""
    system: System = dataclasses.field(default_factory=lambda: systems.SYSTEMS[
        systems.DEFAULT_SYSTEM])
    matmul_precision: str = "default"
    dump: str | None = None
    disable_passes: frozenset[str] = frozenset()
    stochastic_rounding: bool = False
    stochastic_rounding_seed: int = 0
    strict_activation_ranges: bool = True
    collective_algorithm: str | None = None
    max_while_iterations: int = 10000
    simulator_threads: int = 2
    blas_coretype: str = "auto"
    process_timeout: float = 300.0

    def replace(self, **changes) -> "Options":
        """A copy with `changes` (field name -> value, validated like configure())."""
        return dataclasses.replace(self, **{k: _parse(k, v, k) for k, v in changes.items()})

    def describe(self) -> str:
        """The settings that differ from the defaults, as `name=value` pairs."""
        default = Options()
        changed = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                   if f.name != "system" and getattr(self, f.name) != getattr(default, f.name)]
        return ", ".join([f"system={self.system.name}"] + changed)


def _parse(field: str, value: Any, source: str) -> Any:
    setting = _BY_FIELD.get(field)
    if setting is None:
        raise ConfigError(f"{source}: no such jax-trn setting; settings: "
                          f"{', '.join(_BY_FIELD)}")
    try:
        return setting.parse(value)
    except ValueError as e:
        raise ConfigError(f"{source}={value!r}: {e}") from None


LAUNCH_VARIABLES = ("JAX_TRN_COORDINATOR", "JAX_TRN_NUM_PROCESSES", "JAX_TRN_PROCESS_ID")


def launch_variables() -> dict[str, str]:
    """The variables `jax_trn.launch` gave this process (`jax_trn.cluster` reads them):
    those of `LAUNCH_VARIABLES` that are set and not empty."""
    return {v: os.environ[v] for v in LAUNCH_VARIABLES if os.environ.get(v)}


def environment_with(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment with `extra` added: for the processes it starts."""
    return {**os.environ, **extra}


def from_environment(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The settings given by `JAX_TRN_*` variables (validated), by field. Unknown
    `JAX_TRN_*` variables are reported with a warning (a typo would otherwise be silent)."""
    environ = os.environ if environ is None else environ
    found = {}
    for var, text in environ.items():
        if not var.startswith(PREFIX):
            continue
        field = var[len(PREFIX):].lower()
        if var in LAUNCH_VARIABLES:        # jax_trn.launch's, read by jax_trn.cluster
            continue
        if field not in _BY_FIELD:
            close = difflib.get_close_matches(var, [s.variable for s in SETTINGS], n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            warnings.warn(f"{var} is not a jax-trn setting{hint}", stacklevel=2)
            continue
        found[field] = _parse(field, text, var)
    return found


# --- the process's options: configure() before the start, live after it ----------------------

_lock = threading.Lock()
_configured: dict[str, Any] = {}
_live: Options | None = None


def configure(system: str | System | None = None, **settings: Any) -> None:
    """Sets jax-trn options before the `trn` backend starts (they take precedence over
    `JAX_TRN_*` variables). Keyword names are the settings without the prefix, lower
    case: `configure(system="trn1.2xlarge", matmul_precision="highest")`. `system` may
    also be a `jax_trn.systems.System` (a user-made system).

    Raises ConfigError for an unknown setting or value, and RuntimeError once the backend
    has started with different options: its devices exist, so the system cannot change
    under JAX (and compiled programs would silently keep the old settings). Restart the
    Python process (or the notebook kernel) to change them."""
    if system is not None:
        settings["system"] = system
    parsed = {k: _parse(k, v, f"configure({k}=...)") for k, v in settings.items()}
    with _lock:
        if _live is not None:
            differ = {k: v for k, v in parsed.items() if getattr(_live, k) != v}
            if differ:
                raise RuntimeError(
                    "the trn backend has already started with "
                    f"{_live.describe()}; configure({', '.join(differ)}=...) must run "
                    "before the first use of a trn device (jax.devices('trn'), a computation "
                    "on trn). Restart the Python process or notebook kernel to change it.")
            return
        _configured.update(parsed)


def resolve(create_options: Mapping[str, Any] | None = None,
            environ: Mapping[str, str] | None = None) -> Options:
    """The options a new client gets: configure() over create options over the
    environment over the defaults."""
    values = from_environment(environ)
    for key, value in (create_options or {}).items():
        if key in _BY_FIELD:                # JAX may pass options of its own too
            values[key] = _parse(key, value, f"PJRT create option {key!r}")
    with _lock:
        values.update(_configured)
    return Options(**values)


def start(create_options: Mapping[str, Any] | None = None) -> Options:
    """Resolves the options of the process's `trn` client and records them as live."""
    global _live
    options = resolve(create_options)
    with _lock:
        _live = options
    return options


def live() -> Options | None:
    """The options of the running `trn` backend, or None before it starts."""
    return _live


def current() -> Options:
    """The live options, or the ones the backend would start with now."""
    return _live or resolve()


_tracing: contextvars.ContextVar[System | None] = contextvars.ContextVar(
    "jax_trn_tracing_system", default=None)


@contextlib.contextmanager
def tracing_for(system: System):
    """While JAX traces a program for `system` (`estimate`, `compare`): the system a
    hand-written kernel (jax_trn.kernels) is traced for when JAX asks its shapes."""
    token = _tracing.set(system)
    try:
        yield
    finally:
        _tracing.reset(token)


def tracing_system() -> System:
    """The system a program being traced is for: `tracing_for`'s, else this process's."""
    return _tracing.get() or current().system


def get_system(name: str | None = None) -> System:
    """A system preset by name; without a name, the system of the running backend (or
    the one it will start with)."""
    if name is None:
        return current().system
    return _parse("system", name, "system")


def for_compile(options: Options, overrides: Mapping[str, Any]) -> Options:
    """`options` with per-program settings from JAX compiler options
    (`{"jax_trn_matmul_precision": "highest"}`); other keys are not ours and are left to
    JAX. Settings that are not compile-time settings are an error."""
    changes = {}
    for key, value in overrides.items():
        if not key.lower().startswith(PREFIX.lower()):
            _check_xla_option(key, value)
            continue
        field = key[len(PREFIX):].lower()
        setting = _BY_FIELD.get(field)
        if setting is None or not setting.compile_time:
            per_program = ", ".join(s.variable.lower() for s in SETTINGS if s.compile_time)
            raise ConfigError(f"compiler option {key!r} is not a per-program jax-trn "
                              f"setting; those are: {per_program}")
        changes[field] = _parse(field, value, f"compiler option {key}")
    return dataclasses.replace(options, **changes) if changes else options


# XLA's compile options besides its DebugOptions fields (all named xla_*), as XLA's
# PJRT clients accept them; any other name is "No such compile option" there too.
XLA_BUILD_OPTIONS = frozenset({"exec_time_optimization_effort", "memory_fitting_effort",
                               "optimization_level", "memory_fitting_level"})
# DebugOptions fields that are bools (XLA refuses other values for them).
XLA_BOOL_OPTIONS = frozenset({"xla_embed_ir_in_executable", "xla_cpu_enable_fast_math",
                              "xla_detailed_logging", "xla_enable_dumping",
                              "xla_dump_hlo_as_text", "xla_dump_hlo_as_proto",
                              "xla_llvm_disable_expensive_passes"})


def _check_xla_option(key: str, value: Any) -> None:
    """A JAX compiler option that is XLA's: its name must be one (trn ignores them)."""
    if not (key.startswith("xla_") or key in XLA_BUILD_OPTIONS):
        raise ConfigError(f"No such compile option: {key!r}")
    if key in XLA_BOOL_OPTIONS and not isinstance(value, bool) and str(value).lower() not in (
            "true", "false", "1", "0"):
        raise ConfigError(f"{value!r} is not a valid bool value. (compile option {key!r})")


@dataclass(frozen=True)
class PersistentCache:
    """JAX's persistent compilation cache settings (jax_compilation_cache_dir,
    jax_compilation_cache_max_size, jax_persistent_cache_min_compile_time_secs,
    jax_persistent_cache_min_entry_size_bytes), as `runtime.compile_cache` applies them."""
    directory: str
    max_size: int = -1
    min_compile_secs: float = 1.0
    min_entry_bytes: int = 0


def persistent_cache() -> PersistentCache | None:
    """JAX's persistent-cache settings as they apply to trn programs
    (`runtime.compile_cache.Settings`), or None when JAX's cache is off: no
    `jax_compilation_cache_dir`, or `jax_enable_compilation_cache` false. Read from
    JAX's config at each compile, so a directory set after the backend started counts."""
    import jax
    directory = jax.config.jax_compilation_cache_dir
    if not directory or not jax.config.jax_enable_compilation_cache:
        return None
    return PersistentCache(str(directory), int(jax.config.jax_compilation_cache_max_size),
                    float(jax.config.jax_persistent_cache_min_compile_time_secs),
                    max(0, int(jax.config.jax_persistent_cache_min_entry_size_bytes)))


# --- the environment of native libraries the simulator loads -----------------------------------

@contextlib.contextmanager
def native_environment(settings: Mapping[str, str | None]):
    """The process environment with `settings` ({variable: value, None to unset}) for
    the duration (a native library reading its settings when it loads), then restored."""
    saved = {k: os.environ.get(k) for k in settings}
    try:
        _set_environment(settings)
        yield
    finally:
        _set_environment(saved)


def _set_environment(values: Mapping[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _gemm_environment(settings: Mapping[str, str | None]):
    """hw/sgemm.py's OpenBLAS loads with `settings` and the kernel `blas_coretype`
    names, unless auto."""
    core = current().blas_coretype
    if core != "auto":
        settings = {**settings, "OPENBLAS_CORETYPE": core}
    return native_environment(settings)


_sgemm.set_environment(_gemm_environment)
