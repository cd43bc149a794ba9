"""Hardware numerics: FP32 compute with casts on the way in and out (§4).

- `to_fp32`: float inputs widen exactly; integers convert like the FP32 datapath does
  (exact up to 2**24 in magnitude).
- `cast`: FP32 (or int64) results to a storage type. Floats round to nearest even
  (ml_dtypes `astype`, which is RNE, like XLA's `convert`) or stochastically (§4
  [ROUND]). Float -> int truncates toward zero, saturates at the type's range and maps
  NaN to 0, which is what XLA's `convert` gives on CPU. Int -> int wraps (two's
  complement), like XLA. Any -> bool is `!= 0`. float4_e2m1fn (no Inf or NaN) saturates
  at +-6 as ml_dtypes does, and NaN becomes -0 (code 0x8), as XLA's `convert` gives on
  CPU for either sign of NaN (ml_dtypes gives +0 for a negative NaN).
- `round_tf32`: FP32 rounded (RNE) to TF32's 10 mantissa bits, for `precision="tf32"`.
- `Numerics`: the per-core rounding context, given to a `NeuronCore` by whoever makes
  it (default: RNE, seed 0, strict ranges). Stochastic rounding mirrors
  `NEURON_RT_STOCHASTIC_ROUNDING_EN/_SEED` (§4 [ROUND]); its random bits come from a
  counter-based stream keyed by (seed, kernel, instruction index), so the same program
  gives the same bits on every run. The runtime builds each core's Numerics from the
  options (JAX_TRN_STOCHASTIC_ROUNDING, _SEED, JAX_TRN_STRICT_ACTIVATION_RANGES,
  `jax_trn.config`); the hardware model reads no environment.
- `Numerics.strict_ranges`: ScalarE activation functions are only valid on their
  published input ranges (§2.4 [NKI-SHARED], alu.RANGES); when strict (the default)
  inputs outside them give NaN, as the hardware gives "invalid results"; otherwise
  they are computed exactly.
"""
from __future__ import annotations

import zlib

import numpy as np

from . import dtypes as _dt

__all__ = ["to_fp32", "cast", "round_tf32", "Numerics", "is_int"]

_F32 = np.dtype(np.float32)
_F4 = np.dtype(_dt.np_dtype("float4_e2m1fn"))
_F4_NAN = np.uint8(0x8)                         # what XLA makes of NaN in float4_e2m1fn
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def is_int(dt: np.dtype) -> bool:
    """Integer or bool storage (computed natively, without an FP32 round trip)."""
    return _dt.is_int_storage(dt)


def to_fp32(x: np.ndarray) -> np.ndarray:
    return x if x.dtype == _F32 else x.astype(np.float32)


def _float_to_int(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    info = _dt.iinfo(dt)
    y = np.trunc(x.astype(np.float64))
    y = np.nan_to_num(y, nan=0.0, posinf=float(info.max), neginf=float(info.min))
    out = np.clip(y, info.min, info.max).astype(dt)
    if dt.itemsize == 8:                        # float(int64 max) rounds up to 2**63
        out[y >= float(info.max)] = info.max
    return out


def _stochastic(x: np.ndarray, dt: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Round to one of the two neighbours in `dt`, with probability proportional to
    closeness. Starts from RNE and moves to the other neighbour with probability
    |x - rne| / |other - rne|; overflow and NaN keep the RNE result."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = x.astype(dt)
    y32 = y.astype(np.float32)
    bits = y.view(_UINT[dt.itemsize])
    away = np.abs(y32) < np.abs(x)             # sign-magnitude: +1 moves away from 0
    other = np.where(away, bits + 1, bits - 1).astype(bits.dtype).view(dt)
    o32 = other.astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.abs(x.astype(np.float64) - y32) / np.abs(o32.astype(np.float64) - y32)
    # the other neighbour must lie on x's side: a saturated float4 (no Inf) has none
    beyond = (np.abs(o32) > np.abs(y32)) == away
    take = (y32 != x) & np.isfinite(o32) & np.isfinite(y32) & beyond \
        & (rng.random(x.shape) < p)
    return np.where(take, other, y)


def cast(x: np.ndarray, dtype, rounding: str = "rne",
         rng: np.random.Generator | None = None) -> np.ndarray:
    """Convert an FP32 (or integer) array to storage dtype `dtype` (name or np.dtype)."""
    dt = _dt.np_dtype(dtype) if isinstance(dtype, str) else dtype
    if x.dtype == dt:
        return x
    if dt.kind == "b":
        return x != 0
    if dt.kind in "iu" or _dt.is_nibble(dt):
        return _dt.int_astype(x, dt) if is_int(x.dtype) else _float_to_int(x, dt)
    if rounding == "stochastic" and dt.itemsize < 4 and rng is not None:
        y = _stochastic(to_fp32(x), dt, rng)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            y = x.astype(dt)
    return _float4_nan(x, y) if dt == _F4 else y


def _float4_nan(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """NaN -> -0 in a float4_e2m1fn result (XLA's rule; the type has no NaN)."""
    if is_int(x.dtype):
        return y
    nan = np.isnan(x)
    if not nan.any():
        return y
    y = np.array(y, copy=True)
    y.view(np.uint8)[nan] = _F4_NAN
    return y


def round_tf32(x: np.ndarray) -> np.ndarray:
    """FP32 rounded to nearest even at 10 mantissa bits (TF32 = 1/8/10, §4)."""
    x = to_fp32(np.asarray(x))
    bits = x.view(np.uint32)
    lsb = (bits >> np.uint32(13)) & np.uint32(1)
    rounded = (bits + np.uint32(0xFFF) + lsb) & np.uint32(0xFFFFE000)
    return np.where(np.isfinite(x), rounded, bits).view(np.float32)


class Numerics:
    """Rounding context of one core: RNE, or stochastic with a reproducible stream;
    whether activation functions honour their published input ranges; and whether
    replay may split a kernel's numerics over two threads (`lanes`, hw/lanes.py: the
    same bits either way, so it is a simulator setting, not a hardware one)."""
    __slots__ = ("rounding", "seed", "strict_ranges", "lanes", "_key", "_rng")

    def __init__(self, rounding: str = "rne", seed: int = 0, strict_ranges: bool = True,
                 lanes: bool = True):
        if rounding not in ("rne", "stochastic"):
            raise ValueError(f"unknown rounding mode {rounding!r}")
        self.rounding = rounding
        self.seed = seed
        self.strict_ranges = strict_ranges
        self.lanes = lanes
        self._key: tuple[int, ...] = (seed,)
        self._rng: np.random.Generator | None = None

    def at(self, kernel: str, index: int) -> None:
        """Key the random stream of the instruction about to execute."""
        if self.rounding == "stochastic":
            self._key = (self.seed, zlib.crc32(kernel.encode()), index)
            self._rng = None

    def _generator(self) -> np.random.Generator:
        if self._rng is None:
            self._rng = np.random.Generator(np.random.Philox(key=self._key_int()))
        return self._rng

    def _key_int(self) -> int:
        seed, kernel, index = (self._key + (0, 0))[:3]
        return (seed & 0xFFFFFFFF) << 64 | kernel << 32 | (index & 0xFFFFFFFF)

    def cast(self, x: np.ndarray, dtype) -> np.ndarray:
        if self.rounding == "stochastic":
            return cast(x, dtype, "stochastic", self._generator())
        return cast(x, dtype)
