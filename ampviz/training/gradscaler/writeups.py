"""Claims of two public write-ups on GradScaler, each run on the real ``torch.amp.GradScaler("cpu")``.

The write-ups are named by their titles (``WRITEUP_LOSS_SCALING``, ``WRITEUP_GRADSCALER``); lessons
02 and 04 quote a short claim of each and print what these runs measured for it.

* ``step_if_pattern``: ``if scaler.step(opt): scaler.update() else: opt.zero_grad()``, run for real:
  ``step`` returns None, so ``update()`` never runs and the next ``step`` raises.
* ``default_init_scale``: the scale a default-built scaler starts from.
* ``fp16_limits``: which small values a cast to float16 keeps (the normal range vs the subnormals).
* ``update_report``: what ``update()`` changes (the scale) and what it leaves alone (the weights' dtype).
* ``loss_scaling_claims`` / ``gradscaler_claims``: the lessons' tables, one row per claim (the
  TensorFlow snippet's row runs on Keras 3, ``keras_snippet``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ampviz.text import Table, measured, number
from ampviz._args import _whole
from ampviz.training.gradscaler.tiny import INF, _scaler, build_tiny
from ampviz.training.gradscaler.keras_snippet import keras_snippet
from ampviz.training.gradscaler.warning_reports import constructor_warnings

__all__ = ["WRITEUP_LOSS_SCALING", "WRITEUP_GRADSCALER", "PatternRun", "step_if_pattern", "default_init_scale",
           "fp16_limits", "UpdateReport", "update_report", "loss_scaling_claims", "gradscaler_claims"]

#: The titles of the two write-ups (their index gives no author).
WRITEUP_LOSS_SCALING = "详解混合精度训练的梯度稳定性:从损失缩放原理到PyTorch/TensorFlow实战"
WRITEUP_GRADSCALER = "PyTorch自动混合精度训练"

_COLUMNS = ("write-up says", "in English", "measured here")


@dataclass(frozen=True)
class PatternRun:
    """What ``if scaler.step(opt): scaler.update() else: opt.zero_grad()`` did, iteration by iteration.

    ``returned``: what ``scaler.step`` returned each iteration it returned; ``crashed_at``: the
    iteration (1-based) that raised, or None; ``error``: "Type: message" of that exception.
    """

    returned: tuple
    updates: int
    steps_taken: int
    crashed_at: int | None
    error: str | None

    @property
    def verdict(self) -> str:
        if self.crashed_at is None:
            return f"runs {len(self.returned)} iterations"
        return f"crashes at iteration {self.crashed_at}: {self.error}"


def step_if_pattern(iterations: int = 2) -> PatternRun:
    """Run the write-up's skip test for ``iterations`` iterations on a fresh tiny problem and
    ``torch.amp.GradScaler("cpu")``; stop at the first exception and keep its message."""
    iterations = _whole("iterations", iterations, 1, 100)
    tiny, scaler = build_tiny(), _scaler()
    opt, returned, updates = tiny.optimizer, [], 0
    for i in range(1, iterations + 1):
        try:
            opt.zero_grad()
            scaler.scale(tiny.loss()).backward()
            result = scaler.step(opt)
            returned.append(result)
            if result:
                scaler.update()
                updates += 1
            else:
                opt.zero_grad()
        except Exception as exc:  # the crash is the finding: keep its type and exact message
            return PatternRun(tuple(returned), updates, tiny.steps_taken, i, f"{type(exc).__name__}: {exc}")
    return PatternRun(tuple(returned), updates, tiny.steps_taken, None, None)


def default_init_scale() -> float:
    """``torch.amp.GradScaler("cpu").get_scale()`` of a scaler built with torch's defaults."""
    return float(torch.amp.GradScaler("cpu").get_scale())


def fp16_limits() -> dict:
    """torch's float16: its smallest normal, its largest, and which powers of two near the bottom a
    cast keeps (2^-24 survives as a subnormal; 2^-25 becomes 0)."""
    f = torch.finfo(torch.float16)
    kept = lambda x: float(torch.tensor(x, dtype=torch.float32).to(torch.float16)) != 0.0  # noqa: E731
    return {"smallest_normal": float(f.tiny), "max": float(f.max),
            "keeps_2^-24": kept(2.0**-24), "keeps_2^-25": kept(2.0**-25)}


@dataclass(frozen=True)
class UpdateReport:
    """The scale before and after ``update()``, after a clean step (growth_interval=1) and after an
    overflowing one, and the weights' dtype before and after."""

    clean: tuple
    overflow: tuple
    dtypes: tuple


def _one_update(*, overflow: bool, **settings):
    tiny, scaler = build_tiny(), _scaler(**settings)
    dtype_before = str(tiny.weight.dtype)
    scaler.scale(tiny.loss()).backward()
    if overflow:
        with torch.no_grad():
            tiny.weight.grad.view(-1)[0] = INF
    scaler.step(tiny.optimizer)
    before = float(scaler.get_scale())
    scaler.update()
    return (before, float(scaler.get_scale())), (dtype_before, str(tiny.weight.dtype))


def update_report() -> UpdateReport:
    """One iteration of the real scaler twice: clean with ``growth_interval=1`` (the scale grows)
    and with an inf in a gradient (the scale backs off)."""
    clean, d1 = _one_update(overflow=False, growth_interval=1)
    over, d2 = _one_update(overflow=True)
    return UpdateReport(clean, over, tuple(sorted(set(d1 + d2))))


def _arrow(pair) -> str:
    return f"{number(pair[0])} → {number(pair[1])}"


def loss_scaling_claims() -> Table:
    """Lesson 02's table: four claims of the loss-scaling write-up, each with what a run here gave."""
    lim, pattern, init = fp16_limits(), step_if_pattern(2), default_init_scale()
    range_verdict = (f"normal range only: smallest normal {number(lim['smallest_normal'])}, max {number(lim['max'])}; "
                     f"2^-24 kept: {lim['keeps_2^-24']} (subnormal), 2^-25 kept: {lim['keeps_2^-25']}")
    rows = (
        ("FP16表示范围为 [6.1×10^-5, 6.5×10^4]", "fp16 spans [6.1e-5, 6.5e4]", range_verdict),
        ("GradScaler()  # 默认初始缩放系数为2^16", "the default initial scale is 2^16",
         f"holds: get_scale() = {number(init)}"),
        ("if scaler.step(optimizer): scaler.update() else: optimizer.zero_grad()",
         "step() returns True when the update happened",
         f"the step ran ({pattern.steps_taken}) but returned {pattern.returned[0]!r}; {pattern.verdict}"),
        ("FP16+LS 10GB 1.7x 76.1% (ResNet50, V100)", "fp16 with loss scaling: 1.7x faster, 10 GB",
         "not measured here, no source given; lesson 00's env.check() times fp16 and bf16 on this machine"),
        _keras_row(),
    )
    return Table(_COLUMNS, rows, title=f"《{WRITEUP_LOSS_SCALING}》")


def _keras_row() -> tuple:
    """The TensorFlow snippet's row, run on Keras 3's LossScaleOptimizer (``keras_snippet``)."""
    said = ("loss_scale = tf.mixed_precision.LossScaleOptimizer(opt); loss * loss_scale.loss_scale  # 显式缩放损失; "
            "loss_scale.unscale(scaled_grads)  # 反缩放梯度; opt.apply_gradients(...)")
    english = "scale the loss by loss_scale.loss_scale, unscale with loss_scale.unscale, apply with the inner optimizer"
    try:
        run = keras_snippet()
    except (ImportError, RuntimeError) as exc:
        return said, english, f"not run: {exc}"
    (w_inner, s_inner), (w_wrapped, s_wrapped) = run.inner, run.wrapped
    shown = lambda w: "[" + ", ".join(measured(v, 3) for v in w) + "]"  # noqa: E731
    return said, english, (
        f"Keras {run.version} (tf.keras from TensorFlow 2.16): LossScaleOptimizer has no "
        f"{' and no '.join(run.missing)} ({run.error}); an inf gradient applied by the inner optimizer "
        f"makes the weights {shown(w_inner)}, scale {number(s_inner)}; applied by the LossScaleOptimizer "
        f"the step is skipped, weights {shown(w_wrapped)}, scale {number(s_inner)} → {number(s_wrapped)}")


def gradscaler_claims() -> Table:
    """Lesson 04's table: three claims of the GradScaler write-up, each with what a run here gave."""
    up, pattern = update_report(), step_if_pattern(1)
    cuda = constructor_warnings()[0]
    said = cuda.warnings[0].category if cuda.warnings else "no warning"
    rows = (
        ("scaler.update() … 根据需要调整精度", "update() adjusts the precision as needed",
         f"adjusts the scale, not precision: clean step {_arrow(up.clean)}, overflow {_arrow(up.overflow)}; "
         f"weights stay {', '.join(d.replace('torch.', '') for d in up.dtypes)}"),
        ("scaler = torch.cuda.amp.GradScaler()", "build the scaler from torch.cuda.amp",
         f"deprecated: {said}; use torch.amp.GradScaler(\"cuda\") (section 8)"),
        ("scaler.step(optimizer) 来执行优化器的 step()", "scaler.step runs optimizer.step()",
         f"holds when no gradient overflowed: {pattern.steps_taken} step ran, step returned {pattern.returned[0]!r}; "
         "skipped after an overflow (section 2)"),
    )
    return Table(_COLUMNS, rows, title=f"《{WRITEUP_GRADSCALER}》")
