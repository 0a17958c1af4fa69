"""FP8 per-tensor scaling, bit for bit: delayed scaling (Transformer Engine) and current scaling
(torchao), as immutable state machines and fast simulators over a stream of amaxes.

An FP8 tensor is stored as ``fp8(x * scale)``, and read back as ``data / scale``. The scale maps the
tensor's largest magnitude, its *amax*, near the format's ``max`` (448 for E4M3, 57344 for E5M2):
``scale = max / amax``. Where the amax comes from is the difference between the two recipes.

**Current scaling** (``current_scale``, ``current_quantize``) uses the tensor's own amax, computed
just before the cast, as torchao's ``float8`` training does (``torchao/float8/float8_utils.py``,
torchao 0.18): ``amax_to_scale`` divides in float64 and rounds once to float32,
``scale = f32(max / max(amax, 1e-12))`` (``EPS``: an all-zero tensor gets ``max * 1e12``, an inf amax
gives 0, NaN gives NaN), and ``round_to_power_of_2`` rounds the scale down to a power of two as
torchao does, ``exp2(floor(log2(scale)))`` in float32. Granularity ``"tensorwise"`` (one amax) or
``"rowwise"`` (one amax per row, along the last axis: torchao's ``AXISWISE`` with ``axiswise_dim=-1``;
its ``rowwise`` recipe rounds the scales to powers of two). ``convention="te"`` follows
Transformer Engine's current-scaling kernel instead (``compute_scale_from_amax`` in
``transformer_engine/common/recipe/recipe_common.cuh``): a float32 division, an amax of 0, inf or
NaN gives scale 1, and powers of two by clearing the mantissa bits (an exact floor).

**Delayed scaling** (``DelayedScaler``, ``simulate_delayed``) uses the amaxes of earlier steps, as
Transformer Engine's ``DelayedScaling`` recipe does (``transformer_engine/pytorch/quantization.py``,
the Python update ``_default_get_amax_and_update_history`` and ``_default_sf_compute``):

* each step quantizes with the scale in force and records its amax in slot 0 of the history
  (``amax_history_len`` slots, here ``history_len``);
* after the step the window's amax is the largest of the last ``history_len`` amaxes, this step's
  included (``algo="max"``; NaN propagates as in ``torch.max``), or this step's alone
  (``"most_recent"``); the history rolls by one and slot 0 is cleared for the next step;
* the next step's scale is ``(max * (1 / amax)) / 2**margin`` in float32, **unless** the window's
  amax is 0 (or less), inf or NaN: then the scale in force stays. A scale that overflows to inf
  becomes float32's largest value. The division is written ``fp8_max / amax`` in Transformer
  Engine, which torch evaluates as ``amax.reciprocal() * fp8_max`` (eager, TorchScript and
  ``torch.compile`` alike, on the CPU): two float32 roundings, so about a quarter of the scales
  are one ulp away from the correctly rounded ``max / amax`` of torchao and of Transformer
  Engine's CUDA kernel.

An inf (or NaN) amax therefore stays in the window and *freezes* the scale for ``history_len``
steps under ``"max"``, and a spike holds the scale down for as long; both show in the trace.

``convention="cuda"`` follows Transformer Engine's fused update instead, the kernel its PyTorch
modules run by default (``kernel_bulk`` in ``transformer_engine/common/recipe/delayed_scaling.cu``,
``fused_amax_and_scale_update_after_reduction``; the Python update runs instead when
``NVTE_UNFUSED_FP8_UPDATE=1`` or ``amax_compute_algo`` or ``scaling_factor_compute_algo`` is a
callable): the scale is ``(max * 2**-margin) / amax``, one correctly rounded float32 division; a
step whose amax is 0 does not roll the history and keeps the scale (the window stops in time);
and the window's max is taken with ``fmaxf``, which drops NaNs (a NaN freezes nothing under
``"max"``; it still counts, as NaN, under ``"most_recent"``).

The recipe's formats: ``HYBRID`` (Transformer Engine's default) quantizes the forward tensors
(activations, weights) in E4M3 and the gradients in E5M2, ``E4M3`` everything in E4M3 (see
``recipe_formats``); a stream here is one tensor, in one format (``fmt``). The scale starts at 1.

Inputs are numbers, lists, numpy arrays or torch tensors, rounded to float32 first (the amax
history and the scales are float32 tensors in both libraries). Results are read-only numpy
arrays. This module needs numpy only.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ampviz.formats import FP8_E4M3, FP8_E5M2, _TORCH_MAX_NAN, FloatFormat, _describe, _real_array, get_format

__all__ = [
    "ALGOS",
    "GRANULARITIES",
    "CONVENTIONS",
    "DELAYED_CONVENTIONS",
    "EPS",
    "DelayedScaler",
    "DelayedState",
    "DelayedTrace",
    "CurrentScaled",
    "recipe_formats",
    "current_scale",
    "current_quantize",
    "simulate_delayed",
]

#: ``amax_compute_algo`` values (Transformer Engine's strings).
ALGOS = ("max", "most_recent")
#: Current-scaling granularities: one scale per tensor, or one per row (last axis).
GRANULARITIES = ("tensorwise", "rowwise")
#: Whose current-scaling formula: torchao's ``amax_to_scale`` or Transformer Engine's kernel.
CONVENTIONS = ("torchao", "te")
#: Delayed-scaling conventions: Transformer Engine's Python update, or its CUDA kernel.
DELAYED_CONVENTIONS = ("python", "cuda")
#: torchao's floor on the amax (``float8_utils.EPS``).
EPS = 1e-12

_F32 = np.float32
_FLT_MAX = _F32(np.finfo(np.float32).max)
_FP8 = (FP8_E4M3, FP8_E5M2)


# ------------------------------------------------------------------ argument checks
def _fp8_format(fmt) -> FloatFormat:
    f = get_format(fmt)
    if f not in _FP8:
        raise ValueError(f"fmt must be an fp8 format, fp8_e4m3 (max 448) or fp8_e5m2 (max 57344), not {f.name}")
    return f


def _whole(name: str, value, low: int, high: int, hint: str) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a whole number ({hint}), not {_describe(value)}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be a whole number from {low} to {high} ({hint}), not {value}")
    return int(value)


def _choice(name: str, value, choices: tuple) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, not {_describe(value)}")
    return value


def _flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, not {_describe(value)}")
    return bool(value)


def _float32(x, what: str) -> np.ndarray:
    """x as float32 values (float64 rounded once, as a torch cast does)."""
    arr = _real_array(x, what)
    if arr.dtype.kind == "b":
        raise TypeError(f"{what} must be numbers, not booleans")
    with np.errstate(over="ignore", invalid="ignore"):
        return arr.astype(np.float32)


def _amaxes(x, what: str) -> np.ndarray:
    """amaxes as float32, >= 0 (or NaN; -0 becomes +0, as abs gives it)."""
    a = _float32(x, what)
    neg = a < 0
    if neg.any():
        raise ValueError(f"{what} must be >= 0 (an amax is a largest magnitude), got {a[neg].flat[0]!r}")
    return a + _F32(0.0)  # -0.0 + 0.0 is +0.0


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a, order="C")  # a copy (ascontiguousarray would make a 0-d array 1-d)
    a.flags.writeable = False
    return a


# ------------------------------------------------------------------ recipe formats
def recipe_formats(fp8_format="HYBRID") -> tuple[FloatFormat, FloatFormat]:
    """(forward format, backward format) of a Transformer Engine recipe's ``fp8_format``:
    ``"HYBRID"`` (the default) gives (E4M3, E5M2): activations and weights in E4M3, gradients in
    E5M2; ``"E4M3"`` gives E4M3 for both. ``"E5M2"`` is refused, as Transformer Engine refuses it
    ("Pure E5M2 training is not supported.")."""
    if not isinstance(fp8_format, str):
        raise TypeError(f"fp8_format must be 'HYBRID' or 'E4M3', not {_describe(fp8_format)}")
    key = fp8_format.upper()
    if key == "HYBRID":
        return FP8_E4M3, FP8_E5M2
    if key == "E4M3":
        return FP8_E4M3, FP8_E4M3
    if key == "E5M2":
        raise ValueError("fp8_format 'E5M2' is not a recipe: pure E5M2 training is not supported (use 'HYBRID')")
    raise ValueError(f"fp8_format must be 'HYBRID' or 'E4M3', not {fp8_format!r}")


# ------------------------------------------------------------------ current scaling
def _pow2_floor_torchao(scale: np.ndarray) -> np.ndarray:
    """torchao's ``exp2(floor(log2(scale)))`` on float32 scales. Its float32 log2 rounds a scale
    just below 2**k to k, so such a scale rounds *up* to 2**k; the float32 rounding of an accurate
    log2 gives the same floors (checked against torch on every scale within 2**16 ulps of a power
    of two), and ``ldexp`` builds the power exactly."""
    s = np.asarray(scale, np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = np.log2(s.astype(np.float64)).astype(np.float32)
        k = np.floor(lg)
        finite = np.isfinite(k)
        out = np.ldexp(np.float32(1), np.where(finite, k, 0).astype(np.int32)).astype(np.float32)
    return np.where(finite, out, np.where(np.isnan(k), np.float32(np.nan), np.where(k > 0, np.inf, 0))).astype(
        np.float32)


def _pow2_floor_bits(scale: np.ndarray) -> np.ndarray:
    """Transformer Engine's power-of-two scale: the float32 bits with the mantissa cleared."""
    s = np.ascontiguousarray(scale, np.float32)
    return (s.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)


def _current_scale(a: np.ndarray, f: FloatFormat, pow2: bool, convention: str) -> np.ndarray:
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if convention == "torchao":
            # amax.to(float64); finfo.max / clamp(amax, min=EPS); .to(float32)
            res = (np.float64(f.max) / np.maximum(a.astype(np.float64), EPS)).astype(np.float32)
            res = _pow2_floor_torchao(res) if pow2 else res
            return np.where(np.isnan(a), a, res).astype(np.float32)  # torch keeps the amax's NaN, sign and all
        # Transformer Engine: amax clamped up to epsilon (0); 0, inf, NaN -> 1; max / amax in float32
        ok = np.isfinite(a) & (a > 0)
        res = np.where(ok, _F32(f.max) / np.where(ok, a, _F32(1)), _F32(1)).astype(np.float32)
        res = np.where(np.isinf(res), _FLT_MAX, res).astype(np.float32)
        return _pow2_floor_bits(res) if pow2 else res


def current_scale(amax, fmt=FP8_E4M3, round_to_power_of_2=False, convention="torchao"):
    """The current-scaling scale(s) for ``amax`` (a number or an array of them, >= 0), float32.

    ``convention="torchao"``: torchao 0.18's ``amax_to_scale(amax, dtype, round_scales_to_power_of_2)``
    bit for bit: ``f32(max / max(amax, 1e-12))`` computed in float64, then (optionally)
    ``exp2(floor(log2(scale)))`` in float32, which turns a scale just below a power of two into that
    power; a NaN amax gives that NaN, sign and payload. ``convention="te"``: Transformer Engine's
    ``compute_scale_from_amax``: 0, inf and NaN amaxes give 1, otherwise ``max / amax`` in float32
    (inf becomes float32's max), and powers of two by clearing the mantissa (an exact floor).
    Returns a Python float for a single number, else a read-only float32 array of amax's shape.
    """
    f = _fp8_format(fmt)
    pow2 = _flag("round_to_power_of_2", round_to_power_of_2)
    convention = _choice("convention", convention, CONVENTIONS)
    a = _amaxes(amax, "amax")
    res = _current_scale(a, f, pow2, convention)
    if res.ndim == 0:
        return float(res)
    return _readonly(res)


class CurrentScaled(NamedTuple):
    """A tensor quantized with current scaling: ``amax`` and ``scale`` (float32; a 0-d array for
    ``"tensorwise"``, shape ``(..., 1)`` for ``"rowwise"``, as torchao keeps them), ``data`` (the FP8
    values, float32, of x's shape), ``codes`` (their bit patterns, uint8, as torch's cast writes
    them: NaN is 0x7F or 0xFF in both formats) and ``dequantized`` (``data / scale``, float32, as
    torchao's ``to_original_precision``)."""

    amax: np.ndarray
    scale: np.ndarray
    data: np.ndarray
    codes: np.ndarray
    dequantized: np.ndarray


def current_quantize(x, fmt=FP8_E4M3, granularity="tensorwise", round_to_power_of_2=False,
                     convention="torchao") -> CurrentScaled:
    """Quantize ``x`` (at least 1-D for ``"rowwise"``) with current scaling, as torchao's
    ``hp_tensor_to_float8_dynamic`` does on the CPU: amax = max |x| (per row for ``"rowwise"``;
    NaN propagates), ``scale = current_scale(amax, ...)``, data = saturating cast of
    ``f32(x * scale)`` (clamped to ±max, NaN stays NaN).

    NaN, bit for bit as torch 2.13 writes it: ``max`` over a whole tensor of two elements or more
    gives the negative NaN 0xFFFFFFFF (its vectorized max ORs an all-ones mask in), so a tensorwise
    scale is that NaN and every code 0xFF; ``amax`` along rows gives the positive 0x7FC00000
    (codes 0x7F); a lone element gives its own |NaN|. The one place not reproduced: an element that
    is NaN itself under a NaN scale of the other sign, where torch's multiply keeps the scale's NaN
    in its vectorized loop but may keep the element's in the loop's remainder (its last few
    elements, as many as the processor's vector width leaves); here it is always the scale's."""
    f = _fp8_format(fmt)
    granularity = _choice("granularity", granularity, GRANULARITIES)
    pow2 = _flag("round_to_power_of_2", round_to_power_of_2)
    convention = _choice("convention", convention, CONVENTIONS)
    x32 = _float32(x, "x")
    if x32.size == 0:
        raise ValueError("x must not be empty: there is no amax to scale by")
    if granularity == "rowwise" and x32.ndim == 0:
        raise ValueError("x must be at least 1-D for rowwise scaling (one scale per row, along the last axis)")
    ax = np.abs(x32)
    with np.errstate(over="ignore", invalid="ignore"):  # x * scale may overflow: the clamp saturates it
        amax = np.max(ax, axis=None if granularity == "tensorwise" else -1, keepdims=granularity != "tensorwise")
        amax = np.asarray(amax, np.float32)  # np.max propagates NaN; torch's NaN bits follow
        if granularity == "rowwise":
            amax = np.where(np.isnan(amax), _F32(np.nan), amax).astype(np.float32)  # 0x7FC00000
        elif np.isnan(amax):
            amax = np.asarray(_TORCH_MAX_NAN if x32.size > 1 else ax.reshape(()), np.float32)
        scale = _current_scale(amax, f, pow2, convention)
        y = np.where(np.isnan(scale), scale, x32 * scale)  # a NaN scale's NaN wins, as in torch's vector loop
        y = np.clip(y, -_F32(f.max), _F32(f.max))
    data = np.asarray(f.quantize(y), np.float32)
    codes = np.asarray(f.encode(y)).astype(np.uint8)
    # NaN: torch's cast writes 0x7F (with the sign) in both formats (ml_dtypes' E5M2 NaN is 0x7E)
    codes = np.where(np.isnan(y), np.uint8(0x7F) | (np.signbit(y).astype(np.uint8) << 7), codes).astype(np.uint8)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        deq = (data / scale).astype(np.float32)
    return CurrentScaled(*(_readonly(np.asarray(v, dt)) for v, dt in (
        (amax, np.float32), (scale, np.float32), (data, np.float32), (codes, np.uint8), (deq, np.float32))))


# ------------------------------------------------------------------ delayed scaling
class DelayedState(NamedTuple):
    """Where a delayed scaler stands between two steps (immutable): ``scale``, the scale the next
    step uses (a float32 value), and ``history``, the last ``history_len - 1`` amaxes, oldest first
    (float32 values; Transformer Engine's ``amax_history`` is ``[0, *history]``, slot 0 waiting
    for the next step's amax)."""

    scale: float
    history: tuple = ()


@dataclass(frozen=True)
class DelayedScaler:
    """Transformer Engine's delayed scaling for one tensor (``DelayedScaling`` recipe).

    ``margin`` (scale divided by 2**margin), ``history_len`` (``amax_history_len``, default 1024),
    ``algo`` (``amax_compute_algo``: ``"max"`` or ``"most_recent"``), ``fmt`` (fp8_e4m3 or
    fp8_e5m2: which ``max`` the scale aims at), ``convention`` (``"python"``: Transformer Engine's
    Python update; ``"cuda"``: its fused kernel, see the module notes). ``update(state, amax)``
    returns the state after a step whose amax was ``amax``, as ``jmp``'s ``adjust`` does for loss
    scales.
    """

    margin: int = 0
    history_len: int = 1024
    algo: str = "max"
    fmt: FloatFormat = FP8_E4M3
    convention: str = "python"

    def __post_init__(self):
        object.__setattr__(self, "margin", _whole("margin", self.margin, -126, 126,
                                                  "the scale is divided by 2**margin"))
        object.__setattr__(self, "history_len", _whole("history_len", self.history_len, 1, 2**24,
                                                       "amax_history_len, e.g. 1024"))
        _choice("algo", self.algo, ALGOS)
        _choice("convention", self.convention, DELAYED_CONVENTIONS)
        object.__setattr__(self, "fmt", _fp8_format(self.fmt))

    def initial_state(self) -> DelayedState:
        """Scale 1 and an all-zero history, as Transformer Engine starts."""
        return DelayedState(1.0, (0.0,) * (self.history_len - 1))

    def _scale_for(self, window_amax: float, scale: float) -> float:
        """``_default_sf_compute``: the scale after a step whose window amax is ``window_amax``,
        the scale in force being ``scale``."""
        a = _F32(window_amax)
        if not (np.isfinite(a) and a > 0):
            return float(_F32(scale))
        with np.errstate(over="ignore", divide="ignore"):
            if self.convention == "cuda":
                sf = _F32(self.fmt.max) * _F32(2.0**-self.margin) / a
            else:
                sf = (_F32(1) / a) * _F32(self.fmt.max) / _F32(2.0**self.margin)
        return float(_FLT_MAX if np.isinf(sf) else sf)

    def update(self, state: DelayedState, amax) -> DelayedState:
        """The state after one step whose amax (>= 0, inf or NaN) was ``amax``."""
        scale, hist = self._checked(state)
        a = _amaxes(amax, "amax")
        if a.ndim != 0:
            raise ValueError(f"amax must be one number (one step), got shape {a.shape}")
        if self.convention == "cuda" and a == 0:  # the kernel skips the roll; the scale stays
            return DelayedState(scale, tuple(hist.tolist()))
        if self.algo == "most_recent":
            w = a
        elif self.convention == "cuda":  # fmaxf from 0: NaNs are dropped
            w = np.fmax(np.fmax.reduce(hist, initial=_F32(0)), np.fmax(a, _F32(0)))
        else:  # torch.max: NaN propagates
            w = a if hist.size == 0 else np.float32(np.nan) if np.isnan(a) or np.isnan(hist).any() \
                else max(hist.max(), a)
        return DelayedState(self._scale_for(float(w), scale), (*hist.tolist(), float(a))[1:])

    def _checked(self, state) -> tuple[float, np.ndarray]:
        """(scale, history as float32) of a state, or one clear error."""
        if not isinstance(state, DelayedState):
            raise TypeError(f"state must be a DelayedState (e.g. scaler.initial_state()), got {_describe(state)}")
        if not isinstance(state.scale, numbers.Real) or isinstance(state.scale, (bool, np.bool_)):
            raise TypeError(f"state.scale must be a number, not {_describe(state.scale)}")
        if not isinstance(state.history, tuple) or len(state.history) != self.history_len - 1:
            raise ValueError(f"state.history must be a tuple of {self.history_len - 1} amaxes "
                             f"(history_len - 1), got {_describe(state.history)}")
        h = state.history
        if all(type(v) is float for v in h):  # the usual case, quick: Python floats
            with np.errstate(over="ignore"):
                hist = np.array(h, np.float64).astype(np.float32) + _F32(0.0)
            if (hist < 0).any():
                raise ValueError(f"state.history must hold amaxes >= 0, got {hist[hist < 0][0]!r}")
        else:
            hist = _amaxes(h, "state.history")
        return float(_F32(state.scale)), hist

    def _check_state(self, state) -> DelayedState:
        scale, hist = self._checked(state)
        return DelayedState(scale, tuple(hist.tolist()))


@dataclass(frozen=True)
class DelayedTrace:
    """A delayed-scaling run, one entry per step (float32 arrays unless said).

    ``amax``: the amax seen at the step; ``scale``: the scale in force at the step (computed from
    earlier steps); ``scaled_amax``: ``f32(amax * scale)``, where the step's largest element lands;
    ``saturated`` (bool): it lands beyond the format's range (past ``fmt.overflow_boundary``: the
    cast clamps it to ±max, as Transformer Engine's saturating casts and torch's E4M3 cast do; an
    inf amax saturates too; NaN does not count); ``window_amax``: the amax the update after the step
    used (the window's max, or the step's own); ``frozen`` (bool): that update kept the scale
    (window amax 0, inf or NaN); ``final``: the state after the last step.
    """

    scaler: DelayedScaler
    amax: np.ndarray
    scale: np.ndarray
    scaled_amax: np.ndarray
    saturated: np.ndarray
    window_amax: np.ndarray
    frozen: np.ndarray
    final: DelayedState

    @property
    def steps(self) -> int:
        return int(self.amax.size)

    def __repr__(self) -> str:
        return (f"DelayedTrace({self.steps} steps, {int(self.saturated.sum())} saturated, "
                f"{int(self.frozen.sum())} frozen updates, final scale {self.final.scale:g})")


def _sliding_max(x: np.ndarray, L: int) -> np.ndarray:
    """out[i] = max(x[i : i + L]) for i in 0..len(x) - L (NaN propagates), in O(len(x)): the
    van Herk / Gil-Werman prefix and suffix maxima over blocks of L."""
    n = x.size
    m = n - L + 1
    if L == 1:
        return x.copy()
    nb = -(-n // L)
    pad = np.full(nb * L, -np.inf, np.float32)
    pad[:n] = x
    blocks = pad.reshape(nb, L)
    prefix = np.maximum.accumulate(blocks, axis=1).reshape(-1)
    suffix = np.maximum.accumulate(blocks[:, ::-1], axis=1)[:, ::-1].reshape(-1)
    return np.maximum(suffix[:m], prefix[L - 1:L - 1 + m])


def simulate_delayed(amax, margin=0, history_len=1024, algo="max", fmt=FP8_E4M3,
                     state: DelayedState | None = None, convention="python") -> DelayedTrace:
    """Run Transformer Engine's delayed scaling over a stream of amaxes (one per step, >= 0, inf
    or NaN), from ``state`` (default: scale 1, empty history), by Transformer Engine's Python update
    (``convention="python"``) or its CUDA kernel (``"cuda"``). Equals stepping
    ``DelayedScaler(margin, history_len, algo, fmt, convention).update`` once per step, to the bit,
    computed with numpy over the whole stream (a sliding-window max and a forward fill of the
    scales)."""
    scaler = DelayedScaler(margin, history_len, algo, fmt, convention)
    st = scaler.initial_state() if state is None else scaler._check_state(state)
    a = _amaxes(amax, "amax")
    if a.ndim != 1:
        raise ValueError(f"amax must be a 1-D stream, one amax per step (got shape {a.shape})")
    n = a.size
    L = scaler.history_len
    h0 = np.asarray(st.history, np.float32)
    cuda = scaler.convention == "cuda"
    rolled = (a != 0) if cuda else np.ones(n, bool)  # the CUDA kernel skips a zero amax (NaN != 0 rolls)
    kept = a[rolled]
    if scaler.algo == "most_recent":
        window = a.copy()
    else:
        full = np.concatenate((h0, kept))
        if cuda:
            full = np.where(np.isnan(full), _F32(0), full)  # fmaxf drops NaNs
        window = np.zeros(n, np.float32)
        if kept.size:
            window[rolled] = _sliding_max(full, L)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        ok = np.isfinite(window) & (window > 0)
        safe = np.where(ok, window, _F32(1))
        if cuda:
            sf = _F32(scaler.fmt.max) * _F32(2.0**-scaler.margin) / safe
        else:
            sf = (_F32(1) / safe) * _F32(scaler.fmt.max) / _F32(2.0**scaler.margin)
        sf = np.where(np.isinf(sf), _FLT_MAX, sf).astype(np.float32)
        # the scale after step k: sf at the last valid window at or before k, else the starting scale
        last = np.maximum.accumulate(np.where(ok, np.arange(n), -1)) if n else np.zeros(0, np.int64)
        after = np.where(last >= 0, sf[np.maximum(last, 0)], _F32(st.scale)).astype(np.float32)
        scale = np.concatenate(([_F32(st.scale)], after[:-1])).astype(np.float32) if n else np.zeros(0, np.float32)
        scaled = (a * scale).astype(np.float32)
        b = scaler.fmt.overflow_boundary
        sat = (scaled > b) if scaler.fmt.specials == "fn" else (scaled >= b)
    final_scale = float(after[-1]) if n else st.scale
    hist = np.concatenate((h0, kept))[-(L - 1):] if L > 1 else ()
    final = DelayedState(final_scale, tuple(float(v) for v in hist))
    return DelayedTrace(scaler, _readonly(a), _readonly(scale), _readonly(scaled), _readonly(sat),
                        _readonly(window.astype(np.float32)), _readonly(~ok), final)


# ------------------------------------------------------------------ a stream of tensors
#: The recipes ``simulate_fp8_scaling`` runs: Transformer Engine's delayed scaling, or current scaling.
RECIPES = ("delayed", "current")
#: What a non-finite step holds in place of its largest element.
_FINITE, _INF, _NAN = 0, 1, 2


@dataclass(frozen=True)
class TensorStream:
    """A seeded stream of tensors: step ``t`` holds ``f32(base * magnitude[t])``, with the element
    of largest |base| replaced by +inf (``nonfinite[t] == 1``) or NaN (``2``) on a non-finite step.

    ``base`` (float32, ``size`` values: random signs, log2 |base| ~ N(0, spread²)), ``magnitude``
    (float32 per step: a slow random walk in log2, times ``2**spike_log2`` on the ``spike`` steps),
    ``spike`` (bool per step), ``nonfinite`` (uint8 per step: 0, 1 = inf, 2 = NaN). ``tensor(t)``
    builds one step's tensor; ``amax`` is every step's max |x| (inf or NaN on a non-finite step).
    All arrays are read-only."""

    base: np.ndarray
    magnitude: np.ndarray
    spike: np.ndarray
    nonfinite: np.ndarray

    @property
    def steps(self) -> int:
        return int(self.magnitude.size)

    @property
    def size(self) -> int:
        return int(self.base.size)

    @property
    def sorted_abs(self) -> np.ndarray:
        """|base| sorted ascending (float32; computed once)."""
        cached = self.__dict__.get("_sorted_abs")
        if cached is None:
            cached = _readonly(np.sort(np.abs(self.base)))
            object.__setattr__(self, "_sorted_abs", cached)
        return cached

    @property
    def amax(self) -> np.ndarray:
        """max |x| per step, float32: ``f32(max|base| * magnitude)`` (rounding is monotone), inf or
        NaN on a non-finite step."""
        cached = self.__dict__.get("_amax")
        if cached is None:
            top = self.sorted_abs[-1] if self.size else _F32(0)
            with np.errstate(over="ignore"):
                a = (top * self.magnitude).astype(np.float32)
            a = np.where(self.nonfinite == _INF, np.inf, np.where(self.nonfinite == _NAN, np.nan, a))
            cached = _readonly(a.astype(np.float32))
            object.__setattr__(self, "_amax", cached)
        return cached

    def tensor(self, step) -> np.ndarray:
        """The tensor of step ``step`` (0 to steps - 1), float32, a new writable array."""
        step = _whole("step", step, 0, self.steps - 1, f"0 to {self.steps - 1}")
        with np.errstate(over="ignore"):
            x = (self.base * self.magnitude[step]).astype(np.float32)
        kind = int(self.nonfinite[step])
        if kind != _FINITE and x.size:
            x[int(np.argmax(np.abs(self.base)))] = np.inf if kind == _INF else np.nan
        return x

    def __repr__(self) -> str:
        return (f"TensorStream({self.steps:,} steps × {self.size:,} values, {int(self.spike.sum())} spikes, "
                f"{int((self.nonfinite == _INF).sum())} inf and {int((self.nonfinite == _NAN).sum())} NaN steps)")


def _real_arg(name: str, value, low: float, high: float, hint: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number ({hint}), not {_describe(value)}")
    v = float(value)
    if not low <= v <= high:
        raise ValueError(f"{name} must be a number from {low:g} to {high:g} ({hint}), not {v!r}")
    return v


def tensor_stream(steps=2000, size=4096, *, seed=0, spread=3.0, wander=0.02, spike_log2=8, spike_prob=0.004,
                  inf_prob=0.0, nan_prob=0.0) -> TensorStream:
    """A seeded ``TensorStream`` of ``steps`` tensors of ``size`` values each.

    From ``np.random.default_rng(seed)``, always in this order (so that changing one setting moves
    nothing else): the base's log2 magnitudes ~ N(0, ``spread``²) and its signs, the walk's steps
    ~ N(0, ``wander``²) in log2 (the magnitude drifts slowly), the spike steps (each step with
    probability ``spike_prob``: the whole tensor times ``2**spike_log2``), then the non-finite
    steps (probability ``inf_prob`` of an inf, ``nan_prob`` of a NaN, in place of the largest
    element)."""
    steps = _whole("steps", steps, 1, 10**6, "how many tensors, e.g. 2000")
    size = _whole("size", size, 1, 10**6, "values per tensor, e.g. 4096")
    seed = _whole("seed", seed, 0, 2**63 - 1, "any whole number >= 0")
    spread = _real_arg("spread", spread, 0.0, 8.0, "the spread of log2 |value| within a tensor")
    wander = _real_arg("wander", wander, 0.0, 1.0, "the step-to-step drift of log2 magnitude")
    spike_log2 = _whole("spike_log2", spike_log2, 0, 40, "a spike multiplies the tensor by 2**spike_log2")
    spike_prob = _real_arg("spike_prob", spike_prob, 0.0, 1.0, "the chance of a spike per step")
    inf_prob = _real_arg("inf_prob", inf_prob, 0.0, 1.0, "the chance of an inf step")
    nan_prob = _real_arg("nan_prob", nan_prob, 0.0, 1.0, "the chance of a NaN step")
    if inf_prob + nan_prob > 1:
        raise ValueError(f"inf_prob + nan_prob must be at most 1, not {inf_prob + nan_prob!r}")
    rng = np.random.default_rng(seed)
    log_base = rng.normal(0.0, 1.0, size) * spread
    signs = np.where(rng.random(size) < 0.5, -1.0, 1.0)
    walk = np.cumsum(rng.normal(0.0, 1.0, steps) * wander)
    spike = rng.random(steps) < spike_prob
    u = rng.random(steps)
    base = (signs * np.exp2(log_base)).astype(np.float32)
    magnitude = np.exp2(walk + spike_log2 * spike).astype(np.float32)
    nonfinite = np.where(u < inf_prob, _INF, np.where(u < inf_prob + nan_prob, _NAN, _FINITE)).astype(np.uint8)
    return TensorStream(_readonly(base), _readonly(magnitude), _readonly(spike), _readonly(nonfinite))


@dataclass(frozen=True)
class Fp8ScalingTrace:
    """How a ``TensorStream`` lands in an FP8 format, step by step, under a scaling recipe.

    ``recipe`` ("delayed" or "current") and ``settings`` (the recipe's arguments as a dict),
    ``fmt``, ``size`` (values per step); per step: ``amax`` (float32), ``scale`` (the scale in
    force, float32), ``frozen`` (bool: delayed scaling's update after the step kept the scale, as
    ``DelayedTrace.frozen``; all False for current scaling), and counts (int64) of the step's values:

    * ``saturated``: |f32(x * scale)| lies past ``fmt.overflow_boundary`` (max plus half a step at
      max: beyond 464 for E4M3, from 61440 on for E5M2; an inf x too, at a scale > 0), where rounding
      alone would give inf or NaN: the clamp to ±max that Transformer Engine and torchao apply before
      the cast holds it at ±max. (A value between max and the boundary rounds to max anyway, as does
      an amax that a current scale rounded up puts one ulp past max: the same rule as
      ``DelayedTrace.saturated``.)
    * ``underflowed``: x != 0 whose FP8 value is 0 (|x * scale| at most half the smallest subnormal);
    * ``subnormal``: FP8 value nonzero and below ``fmt.smallest_normal`` (fewer significant bits).

    NaN elements, and the NaNs a scale of 0 or NaN makes, count in none of them. The
    ``*_share`` properties are the counts over ``size``."""

    recipe: str
    settings: dict
    fmt: FloatFormat
    size: int
    amax: np.ndarray
    scale: np.ndarray
    frozen: np.ndarray
    saturated: np.ndarray
    underflowed: np.ndarray
    subnormal: np.ndarray

    @property
    def steps(self) -> int:
        return int(self.amax.size)

    @property
    def saturated_share(self) -> np.ndarray:
        return self.saturated / self.size

    @property
    def underflowed_share(self) -> np.ndarray:
        return self.underflowed / self.size

    @property
    def subnormal_share(self) -> np.ndarray:
        return self.subnormal / self.size

    @property
    def saturated_steps(self) -> int:
        """How many steps hold at least one saturated value."""
        return int((self.saturated > 0).sum())

    @property
    def worst_step(self) -> int:
        """The first step that loses the most values (saturated + underflowed)."""
        return int(np.argmax(self.saturated + self.underflowed)) if self.steps else 0

    def summary(self) -> str:
        """One line: the steps that saturate, the steps that lose at least 1% of their values to
        underflow, and the mean share underflowed."""
        lossy = int((self.underflowed_share >= 0.01).sum())
        mean = float(self.underflowed_share.mean()) if self.steps else 0.0
        return (f"{self.saturated_steps:>5,} steps saturate · {lossy:>5,} steps lose ≥ 1% to underflow · "
                f"mean underflowed {mean:6.2%}")

    def table(self, steps) -> str:
        """The given steps as a text table: amax, scale in force, and the counts."""
        idx = [_whole("step", int(t) if isinstance(t, np.integer) else t, 0, self.steps - 1,
                      f"0 to {self.steps - 1}") for t in steps]
        rows = [f"{'step':>6} {'amax':>10} {'scale':>10} {'saturated':>10} {'underflowed':>12} {'subnormal':>10}"]
        for t in idx:
            rows.append(f"{t:>6} {float(self.amax[t]):>10.4g} {float(self.scale[t]):>10.4g} "
                        f"{int(self.saturated[t]):>10,} {int(self.underflowed[t]):>12,} {int(self.subnormal[t]):>10,}")
        return "\n".join(rows)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.settings.items())
        return (f"Fp8ScalingTrace({self.recipe}, {args}, {self.steps:,} steps × {self.size:,} values: "
                f"{self.saturated_steps:,} steps saturate, mean underflowed {self.underflowed_share.mean():.2%})")


def _first_true(sorted_abs: np.ndarray, count: np.ndarray, test) -> np.ndarray:
    """Per step, the first index i < count[step] of ``sorted_abs`` where ``test(values, steps)``
    holds (``count[step]`` where it never does), for a test that is False then True along the
    sorted values: a binary search on every step at once, evaluating the test itself."""
    lo = np.zeros(count.size, np.int64)
    hi = count.astype(np.int64).copy()
    top = max(sorted_abs.size - 1, 0)
    while True:
        active = np.flatnonzero(lo < hi)
        if not active.size:
            return lo
        mid = (lo[active] + hi[active]) // 2
        ok = test(sorted_abs[np.minimum(mid, top)], active)
        hi[active] = np.where(ok, mid, hi[active])
        lo[active] = np.where(ok, lo[active], mid + 1)


def _stream_counts(stream: TensorStream, scale: np.ndarray, f: FloatFormat):
    """(saturated, underflowed, subnormal) counts per step, exactly, from the sorted |base|."""
    b = stream.sorted_abs
    m = stream.magnitude
    s = np.asarray(scale, np.float32)
    bad = stream.nonfinite != _FINITE
    n = np.where(bad, stream.size - 1, stream.size).astype(np.int64)  # the largest element is special
    big, ub = _F32(f.overflow_boundary), _F32(f.underflow_boundary)
    fn = f.specials == "fn"  # E4M3: past 464 overflows (464 ties to 448); E5M2: from 61440 on
    top_sub = _F32(f.smallest_normal - f.smallest_subnormal / 2)  # from here on, the cast rounds up to normal

    def scaled(v, at):
        with np.errstate(over="ignore", invalid="ignore"):
            return np.abs((v * m[at]).astype(np.float32) * s[at]).astype(np.float32)

    with np.errstate(invalid="ignore"):
        zero_x = _first_true(b, n, lambda v, at: (v * m[at]).astype(np.float32) > 0)
        zero_q = _first_true(b, n, lambda v, at: ~(scaled(v, at) <= ub))  # q == 0 below this index
        below_normal = _first_true(b, n, lambda v, at: ~(scaled(v, at) < top_sub))
        over = n - _first_true(b, n, lambda v, at: (scaled(v, at) > big) if fn else (scaled(v, at) >= big))
    inf_sat = (stream.nonfinite == _INF) & (s > 0)  # inf * scale: inf, clamped to max (0 or NaN: NaN)
    saturated = over + inf_sat
    underflowed = np.maximum(zero_q - zero_x, 0)
    subnormal = np.maximum(below_normal - zero_q, 0)
    return saturated.astype(np.int64), underflowed.astype(np.int64), subnormal.astype(np.int64)


def simulate_fp8_scaling(stream, recipe="delayed", *, margin=0, history_len=1024, algo="max", fmt=FP8_E4M3,
                         round_to_power_of_2=False, convention=None) -> Fp8ScalingTrace:
    """Quantize every tensor of ``stream`` (a ``TensorStream``) to ``fmt`` at the scale a recipe puts
    in force, and count per step what saturates, underflows and lands in subnormals.

    ``recipe="delayed"``: the scales of ``simulate_delayed(stream.amax, margin, history_len, algo,
    fmt, convention=convention or "python")`` (each step's scale comes from earlier steps' amaxes).
    ``recipe="current"``: ``current_scale(stream.amax, fmt, round_to_power_of_2, convention or
    "torchao")`` (each step's own amax). Each value is then cast as both libraries cast it:
    ``f32(x * scale)`` clamped to ±max, rounded to the nearest FP8 value (ties to even). The counts
    are exact: a binary search per step over the sorted |base| evaluates that arithmetic itself
    (it is monotone in |base|), so a few thousand steps of a few thousand values take milliseconds.
    """
    if not isinstance(stream, TensorStream):
        raise TypeError(f"stream must be a TensorStream (from tensor_stream(...)), not {_describe(stream)}")
    recipe = _choice("recipe", recipe, RECIPES)
    f = _fp8_format(fmt)
    if recipe == "delayed":
        if round_to_power_of_2 is not False:
            raise ValueError("round_to_power_of_2 applies to current scaling only: leave it False for 'delayed'")
        conv = "python" if convention is None else _choice("convention", convention, DELAYED_CONVENTIONS)
        d = simulate_delayed(stream.amax, margin=margin, history_len=history_len, algo=algo, fmt=f, convention=conv)
        scale, frozen = d.scale, d.frozen
        settings = {"margin": d.scaler.margin, "history_len": d.scaler.history_len, "algo": algo, "convention": conv}
    else:
        pow2 = _flag("round_to_power_of_2", round_to_power_of_2)
        conv = "torchao" if convention is None else _choice("convention", convention, CONVENTIONS)
        scale = np.asarray(current_scale(stream.amax, f, pow2, conv), np.float32)
        frozen = np.zeros(stream.steps, bool)
        settings = {"round_to_power_of_2": pow2, "convention": conv}
    sat, under, sub = _stream_counts(stream, scale, f)
    return Fp8ScalingTrace(recipe, settings, f, stream.size, stream.amax, _readonly(scale), _readonly(frozen),
                           _readonly(sat), _readonly(under), _readonly(sub))


__all__ += ["RECIPES", "TensorStream", "Fp8ScalingTrace", "tensor_stream", "simulate_fp8_scaling"]


# ------------------------------------------------------------------ exercise checkers
def _spike_hold_steps(history_len: int = 16, algo: str = "max") -> int:
    """Steps after a lone ×2^8 spike (flat amax 1 otherwise) whose scale is lower than before it."""
    a = np.ones(60, np.float32)
    a[20] = 256
    tr = simulate_delayed(a, history_len=history_len, algo=algo)
    return int((tr.scale[21:] < tr.scale[20]).sum())


def check_spike_hold(answer):
    """Q: delayed scaling, ``history_len=16``, ``algo="max"``; the amax is flat except for one step
    ×2^8. For how many steps after the spike is the scale 2^8 lower?"""
    from ampviz.checks import check

    return check(answer, _spike_hold_steps(), hint="the spike's amax stays in the window until the history "
                                                   "has rolled past it")


def check_current_scale(answer):
    """Q: torchao's current scaling, E4M3: the scale of a tensor whose amax is 3.5."""
    from ampviz.checks import check

    return check(answer, current_scale(3.5, FP8_E4M3), hint="the scale maps the amax onto the format's max")


def check_inf_current(answer):
    """Q: torchao's current scaling, a tensor with one inf among finite values: what share of the
    finite values become 0?"""
    from ampviz.checks import _said, check

    q = current_quantize(np.array([1.0, 2.0, 3.0, np.inf], np.float32))
    share = float(np.mean(q.data[:3] == 0))

    def accept(a) -> bool:
        said = _said(a)
        if said is not None:
            return said in ("100%", "100 %", "all", "all of them", "1", "1.0") if share == 1 else False
        return not isinstance(a, (bool, np.bool_)) and float(a) == share

    return check(answer, share, accept=accept, hint="what is 448 / inf?")


def check_margin_scale(answer):
    """Q: delayed scaling, E4M3, ``margin=1``: the window's amax is 3.5. The next step's scale?"""
    from ampviz.checks import check

    scale = float(DelayedScaler(margin=1, history_len=1).update(DelayedState(1.0, ()), 3.5).scale)
    return check(answer, scale, hint="the scale is (max / amax) / 2**margin")


__all__ += ["check_spike_hold", "check_current_scale", "check_inf_current", "check_margin_scale"]
