"""The persistent compilation cache (issue 19): trn programs cached in the directory
JAX's own cache uses, under JAX's settings, and PJRT_Executable_Serialize /
DeserializeAndLoad on the same format (jax_trn/runtime/compile_cache.py)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from jax_trn import config
from jax_trn.runtime import compile_cache, compiler

ROOT = pathlib.Path(__file__).resolve().parents[2]

# One program, compiled in a fresh process with the cache in `cache_dir`. With
# NO_COMPILE set, compiling raises: the program can only come from the cache.
PROGRAM = """
    import os, sys
    import jax, jax.numpy as jnp, numpy as np
    import jax_trn
    from jax_trn.runtime import compiler

    jax.config.update("jax_compilation_cache_dir", sys.argv[1])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    if os.environ.get("NO_COMPILE"):
        def refuse(*args, **kwargs):
            raise RuntimeError("compiled, though the program is in the cache")
        compiler.to_ir = compiler.lower = refuse
    dev = jax.devices("trn")[0]
    x = jax.device_put(np.linspace(-3, 3, 512 * 256, dtype=np.float32).reshape(512, 256), dev)
    with jax_trn.profile() as prof:
        y = jax.jit(lambda a: jnp.tanh(a @ a.T).sum(0))(x)
    print(float(np.asarray(y).sum()), prof.executions[-1].simulated_time_s)
"""


def _run(cache_dir, env=None, *, wait=True):
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(PROGRAM), str(cache_dir)],
                            cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return out.split()


def _entries(cache_dir) -> list[pathlib.Path]:
    path = pathlib.Path(cache_dir) / compile_cache.SUBDIR
    return sorted(p for p in path.iterdir() if not p.name.startswith(".")) if path.exists() else []


def test_a_second_process_reads_the_program_from_the_cache(tmp_path):
    first = _run(tmp_path)
    assert len(_entries(tmp_path)) == 1
    again = _run(tmp_path, {"NO_COMPILE": "1"})
    assert again == first                     # same result, same simulated time


def test_another_system_is_another_program(tmp_path):
    _run(tmp_path)
    other = _run(tmp_path, {"JAX_TRN_SYSTEM": "trn1.2xlarge"})
    assert len(_entries(tmp_path)) == 2
    assert _run(tmp_path, {"JAX_TRN_SYSTEM": "trn1.2xlarge", "NO_COMPILE": "1"}) == other


def test_damaged_entries_are_recompiled_and_replaced(tmp_path):
    first = _run(tmp_path)
    entry, = _entries(tmp_path)
    entry.write_bytes(entry.read_bytes()[:100])           # truncated
    assert _run(tmp_path) == first
    assert _run(tmp_path, {"NO_COMPILE": "1"}) == first    # rewritten whole


def test_two_processes_compiling_the_same_program_at_once(tmp_path):
    procs = [_run(tmp_path, wait=False) for _ in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        outs.append(out.split())
    assert outs[0] == outs[1] and len(_entries(tmp_path)) == 1
    assert _run(tmp_path, {"NO_COMPILE": "1"}) == outs[0]


# --- in-process: the client with a cache directory, JAX's own config untouched ------------

@pytest.fixture
def cache_at(monkeypatch, tmp_path):
    def use(**settings):
        s = config.PersistentCache(str(tmp_path), **{"min_compile_secs": 0.0, **settings})
        monkeypatch.setattr(config, "persistent_cache", lambda: s)
        return tmp_path
    return use


def _compile(jax, trn, fn, *args):
    return jax.jit(fn).lower(*(jax.device_put(a, trn) for a in args)).compile()


def test_jax_settings_decide_what_is_written(jax, trn, cache_at, tmp_path):
    x = np.ones((64, 64), np.float32)
    cache_at(min_compile_secs=3600.0)                      # JAX's default is 1 s
    _compile(jax, trn, lambda a: a * 3.5, x)
    assert _entries(tmp_path) == []
    cache_at(min_entry_bytes=1 << 40)
    _compile(jax, trn, lambda a: a * 4.5, x)
    assert _entries(tmp_path) == []
    cache_at()
    _compile(jax, trn, lambda a: a * 5.5, x)
    assert len(_entries(tmp_path)) == 1


def test_the_directory_stays_under_its_size_limit(jax, trn, cache_at, tmp_path):
    x = np.ones((64, 64), np.float32)
    cache_at()
    _compile(jax, trn, lambda a: a * 6.5, x)
    one = _entries(tmp_path)[0].stat().st_size
    cache_at(max_size=int(2.5 * one))
    for k in range(4):
        _compile(jax, trn, lambda a, k=k: a * (7.5 + k), x)
    sizes = [p.stat().st_size for p in _entries(tmp_path)]
    assert sum(sizes) <= 2.5 * one and len(sizes) == 2


def test_on_and_off_as_jax_says(jax, tmp_path):
    from jax._src import config as jax_config
    assert jax.config.jax_compilation_cache_dir or config.persistent_cache() is None
    with jax_config.compilation_cache_dir(str(tmp_path)):
        assert config.persistent_cache() == config.PersistentCache(str(tmp_path))
        with jax_config.enable_compilation_cache(False):
            assert config.persistent_cache() is None


def test_programs_with_host_callbacks_are_not_written(jax, trn, cache_at, tmp_path):
    cache_at()
    x = np.ones((8,), np.float32)
    _compile(jax, trn, lambda a: jax.pure_callback(np.sin, jax.ShapeDtypeStruct((8,),
                                                                              np.float32), a), x)
    assert _entries(tmp_path) == []


def test_another_plugin_version_misses(monkeypatch):
    blob = compile_cache.dumps({"a": 1})
    assert compile_cache.loads(blob) == {"a": 1}
    monkeypatch.setattr(compile_cache, "plugin_digest", lambda: "another jax-trn")
    with pytest.raises(compile_cache.CacheFormatError):
        compile_cache.loads(blob)
    with pytest.raises(compile_cache.CacheFormatError):
        compile_cache.loads(b"PK\x03\x04 a zip file")


def test_aot_serialization_round_trip(jax, trn):
    from jax.experimental import serialize_executable as se
    jnp = jax.numpy
    x = jax.device_put(np.arange(12, dtype=np.float32).reshape(3, 4), trn)
    compiled = jax.jit(lambda a: jnp.sin(a) * 2).lower(x).compile()
    payload, in_tree, out_tree = se.serialize(compiled)
    loaded = se.deserialize_and_load(payload, in_tree, out_tree, backend="trn",
                                     execution_devices=[trn])
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(compiled(x)))


def test_a_serialized_program_of_another_system_is_refused(jax):
    import dataclasses
    from jax_trn.runtime.client import Client, CompileError
    rt = Client(config.resolve())
    code = jax.jit(lambda a: a + 1).lower(np.ones(4, np.float32)).as_text().encode()
    compiled = compiler.compile_program(code, rt.options, name="m")
    other = dataclasses.replace(rt.options, system=config.get_system("trn1.2xlarge"))
    blob = compile_cache.dumps((compiled, b"", other))
    with pytest.raises(CompileError, match="compiled for trn1"):
        rt.deserialize(blob)


def test_a_cached_complex_program_shows_complex_types(jax, trn, cache_at, tmp_path):
    cache_at()
    x = np.arange(6, dtype=np.complex64).reshape(2, 3)
    _compile(jax, trn, lambda a: a * (1 + 2j), x)
    entry, = _entries(tmp_path)
    stored = compile_cache.loads(entry.read_bytes())
    assert stored.module is None
    assert "(%arg0: tensor<2x3xcomplex<f32>>) -> (tensor<2x3xcomplex<f32>>)" in stored.mlir_text


def test_a_loaded_program_is_not_left_to_the_young_collections():
    # A loaded program is made with the collector paused: left in the youngest
    # generation, the next young collections walk all of it (seconds for a training
    # step) to free nothing. It goes straight to the oldest generation.
    import gc
    blob = compile_cache.dumps([[k, str(k)] for k in range(2000)])
    assert gc.isenabled() and gc.get_freeze_count() == 0
    payload = compile_cache.loads(blob)
    young = {id(o) for g in (0, 1) for o in gc.get_objects(generation=g)}
    assert id(payload) not in young and id(payload[7]) not in young
    assert any(o is payload for o in gc.get_objects(generation=2))
    assert gc.get_freeze_count() == 0


def test_the_platform_version_names_the_build(monkeypatch):
    # JAX's own cache (engaged for trn when a CPU program compiled first) keys its
    # entries by the platform version: another build of jax-trn must miss there too.
    from jax_trn.runtime.client import Client
    version = Client(config.resolve()).platform_version
    monkeypatch.setattr(compile_cache, "plugin_digest", lambda: "0123456789abcdef")
    other = Client(config.resolve()).platform_version
    assert other != version and "0123456789ab" in other


def test_a_loaded_kernel_unpickles_its_instructions_when_first_asked(jax):
    # Loading a training step made 130,000 instruction objects nothing reads before
    # the program runs; each kernel's are made when it first runs.
    from jax_trn.hw.program import Kernel
    rt_options = config.resolve()
    jnp = jax.numpy
    code = jax.jit(lambda a, b: jnp.tanh(a @ b).sum(0) + jnp.exp(b).max(1)).lower(
        np.ones((256, 128), np.float32), np.ones((128, 128), np.float32)).as_text().encode()
    compiled = compiler.compile_program(code, rt_options, name="m").without_ir()
    loaded = compile_cache.loads(compile_cache.dumps(compiled))
    kernels, originals = loaded.program.kernels, compiled.program.kernels
    assert len(kernels) == len(originals) > 1
    assert all(isinstance(k, Kernel) and "instructions" not in vars(k) for k in kernels)
    again = compile_cache.loads(compile_cache.dumps(loaded))      # still packed
    assert all("instructions" not in vars(k) for k in kernels + again.program.kernels)
    import gc
    first = kernels[0].instructions            # made now, straight into the oldest generation
    assert any(o is first for o in gc.get_objects(generation=2))
    for k, original in zip(kernels + again.program.kernels, originals + originals):
        assert k.instructions == original.instructions and k.name == original.name
        assert k.dram == original.dram and k.flops == original.flops
        assert "_packed" not in vars(k)


def test_a_foreign_file_under_the_key_is_ignored_and_replaced(tmp_path):
    cache = compile_cache.DiskCache(config.PersistentCache(str(tmp_path), min_compile_secs=0.0))
    assert cache.store("k", {"a": 1}, compile_secs=5.0)
    entry = cache.path / "k"
    for foreign in (b"PK\x03\x04 a zip file", b"", compile_cache.MAGIC + b"\0" * 40,
                    entry.read_bytes()[:-1]):
        entry.write_bytes(foreign)
        assert cache.load("k") is None
        assert cache.store("k", {"a": 2}, compile_secs=5.0) and cache.load("k") == {"a": 2}
