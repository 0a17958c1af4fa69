"""FP8 delayed scaling, bit for bit, as Transformer Engine's ``DelayedScaling`` recipe: each step
uses a scale computed from the amaxes of earlier steps (a window of ``history_len`` of them).
``DelayedScaler`` is the immutable state machine (``update(state, amax)`` gives the next
``DelayedState``), ``simulate_delayed`` runs it over a whole stream of amaxes with numpy at once
(a ``DelayedTrace``), by Transformer Engine's Python update or its CUDA kernel. The rules are told
in ``ampviz.formats.fp8``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ampviz.formats.catalog import FP8_E4M3
from ampviz.formats.fp8.common import _F32, _FLT_MAX, _amaxes, _choice, _fp8_format, _readonly, _whole
from ampviz.formats.inputs import _describe
from ampviz.formats.spec import FloatFormat

#: ``amax_compute_algo`` values (Transformer Engine's strings).
ALGOS = ("max", "most_recent")
#: Delayed-scaling conventions: Transformer Engine's Python update, or its CUDA kernel.
DELAYED_CONVENTIONS = ("python", "cuda")


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
