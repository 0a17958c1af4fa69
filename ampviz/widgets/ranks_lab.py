"""RanksLab: one loss scaler per rank, and how the ranks learn of each other's overflows."""

from __future__ import annotations

import html
import math
import re

import numpy as np

import ipywidgets as W

from ampviz.widgets.figureview import FigureView
from ampviz.plots import format_pow2, plot_ranks

from ampviz.widgets.base import _Explorer, _real, _shown, _table, _whole

_STEP_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$")
_STEP_CHARS_SHOWN = 20  # how much of a step list a message repeats
_STEPS_LISTED = 8  # how many overflow steps the readout lists before it counts the rest


class _StepsNotRead(ValueError):
    """The "at steps" text could not be read (or names a step beyond the run)."""


def overflow_summary(flags: np.ndarray) -> str:
    """A rank's own overflows (its row of the flags), in words: "steps 5, 20", "no step", or the
    first few and how many in all ("steps 2, 5, 8, 11, 14, 17, … (20 in all)")."""
    at = np.flatnonzero(np.asarray(flags, bool)).tolist()
    if not at:
        return "no step"
    if len(at) <= _STEPS_LISTED:
        return ("step " if len(at) == 1 else "steps ") + ", ".join(f"{t:,}" for t in at)
    return "steps " + ", ".join(f"{t:,}" for t in at[:_STEPS_LISTED - 2]) + f", … ({len(at):,} in all)"


def _log2_init(init_scale, lo: int, hi: int, name: str = "init_scale") -> int:
    """log2 of ``init_scale``, a power of two from 2^lo to 2^hi (the slider moves in powers of two)."""
    x = _real(name, init_scale)
    if x > 0 and math.isfinite(x):
        m, e = math.frexp(x)
        if m == 0.5 and lo <= e - 1 <= hi:
            return e - 1
    raise ValueError(f"{name} must be a power of two from 2^{lo} to 2^{hi} (the slider moves in powers "
                     f"of two), got {_shown(init_scale)}")


#: The gradient all-reduce's dtype: (what the learner reads, the value). DDP's default all-reduce is
#: fp32; ``fp16_compress_hook`` and a bf16 hook cast each rank's *scaled* gradients first.
REDUCE_DTYPES = (("fp32 (DDP's default all-reduce)", "fp32"),
                 ("fp16 (fp16_compress_hook)", "fp16"),
                 ("bf16 (a bf16 compress hook)", "bf16"))
_REDUCE_NAMES = {"fp32": "the fp32 all-reduce", "fp16": "fp16_compress_hook", "bf16": "the bf16 hook"}


def _reduce_format(reduce_dtype: str):
    from ampviz.formats import BF16, FP16, FP32

    return {"fp32": FP32, "fp16": FP16, "bf16": BF16}[reduce_dtype]


def cast_overflows(scale, grad_max, reduce_dtype="fp16") -> np.ndarray:
    """Whether a rank's gradients become inf on their way into the all-reduce: the scaled gradient
    is computed in float32 (``f32(f32(scale) * f32(grad_max))``), then the hook casts it to
    ``reduce_dtype`` *before* dividing by the world size (``buffer.to(dtype).div_(world_size)``).
    So fp16's cast overflows once that product rounds to 65,520 or more (whatever the number of
    ranks); bf16 and fp32 only near 3.4e38. ``grad_max`` is the rank's largest |gradient| (by
    monotone rounding it decides for the whole tensor); numbers or broadcastable arrays. This is
    ``ampviz.scaling.overflows(scale, grad_max, fmt, "float32")`` with the all-reduce's format.
    (The fp16 sum of the divided values could itself round to inf only if one entry were close to
    65,504 with one sign on every rank at once; one max|g| per rank cannot show that, and the
    N(0, 1) gradients of ``simulate_compress_hook`` agree with this rule step for step.)"""
    from ampviz.scaling import overflows

    if not isinstance(reduce_dtype, str) or reduce_dtype not in _REDUCE_NAMES:
        raise ValueError(f"reduce_dtype must be one of {', '.join(map(repr, _REDUCE_NAMES))}, got "
                         f"{_shown(reduce_dtype)}")
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(overflows(scale, grad_max, _reduce_format(reduce_dtype), "float32"), bool)


def simulate_lab(policy, found_inf, grad_max, mode="ddp", reduce_dtype="fp32"):
    """The lab's model: ``simulate_ranks`` with each rank's own backward overflows (``found_inf``,
    shape (ranks, steps)) and its largest unscaled |parameter gradient| (``grad_max``: a number or
    an array broadcast to that shape). In ``"ddp"`` mode the gradients pass the all-reduce in
    ``reduce_dtype``: a step is skipped on every rank when any rank's backward overflowed or its
    scaled gradients overflow the cast (``cast_overflows``). The other modes have no DDP
    all-reduce (and so no comm hook): their gradients stay float32 whatever ``reduce_dtype`` is.
    With ``reduce_dtype="fp32"`` and a ``grad_max`` of 1 this is ``simulate_ranks(policy,
    found_inf=found_inf, mode=mode)`` exactly: a float32 scale stays below 2^128."""
    from ampviz.ranks import simulate_ranks  # loads torch: only when a lab is made

    flags = np.asarray(found_inf, bool)
    fmt = _reduce_format(reduce_dtype if mode == "ddp" else "fp32")
    g = np.where(flags, np.inf, np.broadcast_to(np.asarray(grad_max, np.float64), flags.shape))
    return simulate_ranks(policy, grad_max=g, mode=mode, fmt=fmt, loss_dtype="float32")


def parse_overflow_steps(text, steps: int) -> np.ndarray:
    """The steps a learner typed, as a boolean array of length ``steps`` (True: the rank overflows).

    Either step numbers and ranges, separated by commas or spaces (``"5, 20"``, ``"3 7-9"``; steps
    count from 0; nothing typed means no overflow), or a pattern of ``x`` (an overflow) and ``.`` (a
    clean step) that repeats to fill the run (``"..x"``: steps 2, 5, 8, ...). Anything else, or a
    step beyond the run, is a ValueError with a one-line message."""
    if not isinstance(text, str):
        raise TypeError(f"the overflow steps must be text such as '5, 20' or '..x', got {_shown(text)}")
    steps = _whole("steps", steps, 1)
    flags = np.zeros(steps, bool)
    s = text.strip()
    if not s:
        return flags
    if all(c in "xX." or c.isspace() for c in s):
        pattern = [c.lower() == "x" for c in s if not c.isspace()]
        if len(pattern) > steps:
            raise ValueError(f"the pattern is {len(pattern):,} steps long but the run has {steps:,}: shorten it "
                             f"or add steps")
        return np.resize(np.array(pattern, bool), steps)
    for item in re.split(r"[,;\s]+", re.sub(r"\s*-\s*", "-", s)):
        if not item:
            continue
        m = _STEP_ITEM.match(item)
        if m is None:
            raise ValueError(f"could not read {_shown(item, _STEP_CHARS_SHOWN)} as a step: type steps such as "
                             f"'5, 20', a range such as '7-9', or a pattern such as '..x' (x: an overflow)")
        first_text, last_text = m.group(1), m.group(2) or m.group(1)
        first, last = (int(t) if len(t) <= 9 else 10**9 for t in (first_text, last_text))  # 10^9: beyond any run
        if last < first:
            raise ValueError(f"the range {_shown(item, _STEP_CHARS_SHOWN)} runs backwards: write the lower "
                             f"step first, e.g. '7-9'")
        if last >= steps:
            shown = f"{last:,}" if len(last_text) <= 9 else _shown(last_text, _STEP_CHARS_SHOWN)
            raise ValueError(f"step {shown} is beyond the run (steps 0 to {steps - 1:,}): add steps or "
                             f"choose an earlier step")
        flags[first:last + 1] = True
    return flags


class RanksLab(_Explorer):
    """Data-parallel ranks, each with its own loss scaler, as ``ampviz.ranks.simulate_ranks`` runs
    them (a simulation: no process is started).

    Controls: ``ranks_slider`` (2 to 8 ranks), ``mode_dropdown`` (how the ranks learn of an
    overflow: ``MODES``), ``rank_dropdown`` and ``steps_text`` (which rank's own gradients
    overflow, and at which steps: ``"5, 20"``, ``"7-9"`` or a repeating pattern ``"..x"``; see
    ``parse_overflow_steps``), ``init_slider`` (log2 of init_scale), ``interval_input``
    (growth_interval) and ``steps_input`` (the length of the run). Every rank runs
    ``torch.amp.GradScaler``'s rule (``TorchGradScaler``) with these settings. ``reduce_dropdown``
    picks the dtype of DDP's gradient all-reduce (``REDUCE_DTYPES``: fp32, DDP's default;
    ``fp16_compress_hook``; a bf16 hook) and ``grad_slider`` the size of the parameter gradients
    (log2 of every rank's largest unscaled |g| at every step). The hooks cast each rank's *scaled*
    gradients before dividing by the world size, so with fp16 every step where S × max|g| reaches
    65,520 is skipped on every rank, skips the fp32 all-reduce does not have, and the scale settles
    lower (``simulate_lab``, ``cast_overflows``). The dtype is a DDP comm hook: in the other modes
    the dropdown is disabled and the gradients stay fp32.

    State: ``trace`` (the ``RanksTrace``), ``found_inf`` (each rank's own overflows, the input to
    the simulation), ``figure`` (``plot_ranks``), ``error``. The readout is a table per rank:
    final scale, own overflows, skipped steps, steps on inf/NaN, under a line that says which
    overflows were simulated ("rank 1 overflows at steps 5, 20"). The "at steps" box is read on
    Enter (or when it loses focus), not at every keystroke. Text that cannot be read, or a step
    beyond the run, shows a one-line message that says it is not applied and what the figure and
    table, which stay as they were, still show.
    """

    #: The sync modes: (what the learner reads, ``simulate_ranks``'s mode).
    MODES = (("DDP (all-reduce before unscale_)", "ddp"),
             ("ShardedGradScaler / synced flag", "synced"),
             ("a scaler per rank, no all-reduce", "local"),
             ("unscale_ + clip before a manual all-reduce", "unscale_first"))
    RANKS_RANGE = (2, 8)
    #: log2 of the init_scale the slider reaches.
    LOG2_INIT_RANGE = (-10, 40)
    MAX_INTERVAL = 10**7
    #: The longest run (a few milliseconds to simulate).
    MAX_STEPS = 10_000
    #: How many drawn settings are kept for reuse (recent ones and a slider's next positions).
    KEPT_DRAWN = 8

    #: log2 of the largest |parameter gradient| the slider reaches.
    LOG2_GRAD_RANGE = (-30, 30)
    REDUCE_DTYPES = REDUCE_DTYPES

    def __init__(self, ranks=4, *, mode="ddp", overflow_rank=1, overflow_steps="5, 20", init_scale=2.0**16,
                 growth_interval=10, steps=60, reduce_dtype="fp32", grad_max=1.0):
        self._init_common()
        ranks = _whole("ranks", ranks, *self.RANKS_RANGE)
        modes = dict((m, label) for label, m in self.MODES)
        if not isinstance(mode, str) or mode not in modes:
            raise ValueError(f"mode must be one of {', '.join(map(repr, modes))}, got {_shown(mode)}")
        overflow_rank = _whole("overflow_rank", overflow_rank, 0, ranks - 1)
        steps = _whole("steps", steps, 1, self.MAX_STEPS)
        if isinstance(overflow_steps, (list, tuple)):
            overflow_steps = ", ".join(str(_whole("an overflow step", s, 0, steps - 1)) for s in overflow_steps)
        if not isinstance(overflow_steps, str):
            raise TypeError(f"overflow_steps must be text such as '5, 20' or '..x', or a list of steps, got "
                            f"{_shown(overflow_steps)}")
        parse_overflow_steps(overflow_steps, steps)  # refused now, not shown later
        log2_init = _log2_init(init_scale, *self.LOG2_INIT_RANGE)
        growth_interval = _whole("growth_interval", growth_interval, 1, self.MAX_INTERVAL)
        dtypes = [d for _, d in REDUCE_DTYPES]
        if not isinstance(reduce_dtype, str) or reduce_dtype not in dtypes:
            raise ValueError(f"reduce_dtype must be one of {', '.join(map(repr, dtypes))}, got {_shown(reduce_dtype)}")
        log2_grad = _log2_init(grad_max, *self.LOG2_GRAD_RANGE, name="grad_max")

        self.trace = None
        self.found_inf = None
        self._applied = None  # (rank, what its overflows are, steps) that the figure and table show
        self._syncing = False  # the rank dropdown's options are being rebuilt
        style = {"description_width": "130px"}
        wide = W.Layout(width="420px")
        self.ranks_slider = W.IntSlider(value=ranks, min=self.RANKS_RANGE[0], max=self.RANKS_RANGE[1],
                                        description="ranks", style=style, layout=wide)
        self.mode_dropdown = W.Dropdown(options=list(self.MODES), value=mode, description="how ranks sync",
                                        style=style, layout=wide)
        self.rank_dropdown = W.Dropdown(options=self._rank_options(ranks), value=overflow_rank,
                                        description="overflow on", style=style)
        # read on Enter (or when the box loses focus), never keystroke by keystroke: "1e309" is
        # never drawn as the "1" typed on the way
        self.steps_text = W.Text(value=overflow_steps, description="at steps", style=style, layout=wide,
                                 placeholder="e.g. 5, 20 or 7-9, or a pattern ..x (repeats); then Enter",
                                 continuous_update=False)
        self.init_slider = W.IntSlider(value=log2_init, min=self.LOG2_INIT_RANGE[0], max=self.LOG2_INIT_RANGE[1],
                                       description="log2 init_scale", style=style, layout=wide)
        self.interval_input = W.BoundedIntText(value=growth_interval, min=1, max=self.MAX_INTERVAL,
                                               description="growth_interval", style=style)
        self.steps_input = W.BoundedIntText(value=steps, min=1, max=self.MAX_STEPS, description="steps",
                                            style=style)
        self.reduce_dropdown = W.Dropdown(options=list(REDUCE_DTYPES), value=reduce_dtype,
                                          description="all-reduce dtype", style=style, layout=wide,
                                          disabled=mode != "ddp", tooltip=self._REDUCE_TIP)
        self.grad_slider = W.IntSlider(value=log2_grad, min=self.LOG2_GRAD_RANGE[0], max=self.LOG2_GRAD_RANGE[1],
                                       description="log2 max|g|", style=style, layout=wide,
                                       tooltip="log2 of every rank's largest unscaled |parameter gradient| at "
                                               "every step")
        self.ranks_slider.observe(self._on_ranks, names="value")  # first: the rank dropdown follows
        for w, cls in ((self.ranks_slider, "count"), (self.mode_dropdown, "mode"),
                       (self.rank_dropdown, "overflow-rank"), (self.steps_text, "overflow-steps"),
                       (self.init_slider, "init"), (self.interval_input, "interval"),
                       (self.steps_input, "steps"), (self.reduce_dropdown, "reduce-dtype"),
                       (self.grad_slider, "grad")):
            w.add_class(f"ampviz-ranks-{cls}")
            w.observe(self._on_change, names="value")
        self.readout = W.HTML()
        self.readout.add_class("ampviz-ranks-readout")
        self.view.add_class("ampviz-ranks-figure")
        self.ui = W.VBox([
            W.HBox([W.VBox([self.ranks_slider, self.mode_dropdown, self.rank_dropdown, self.steps_text]),
                    W.VBox([self.init_slider, self.interval_input, self.steps_input]),
                    W.VBox([self.reduce_dropdown, self.grad_slider])],
                   layout=W.Layout(flex_flow="row wrap")),
            self.message, self.readout, self.view,
        ])
        self.ui.add_class("ampviz-ranks-lab")
        self.update()

    _REDUCE_TIP = ("the dtype of DDP's gradient all-reduce (a DDP comm hook: DDP mode only; the other modes "
                   "keep fp32 gradients)")

    # ----- read the controls -----
    @staticmethod
    def _rank_options(ranks: int) -> list:
        return [(f"rank {r}", r) for r in range(ranks)]

    @property
    def mode(self) -> str:
        return self.mode_dropdown.value

    @property
    def reduce_dtype(self) -> str:
        """The all-reduce dtype chosen (it acts in the DDP mode only)."""
        return self.reduce_dropdown.value

    @property
    def grad_max(self) -> float:
        """Every rank's largest unscaled |parameter gradient| at every step: 2^(the slider)."""
        return 2.0 ** int(self.grad_slider.value)

    def policy(self):
        """Every rank's scaler: ``torch.amp.GradScaler``'s rule with the lab's settings."""
        return self._policy_of(self.init_slider.value, self.interval_input.value)

    @staticmethod
    def _policy_of(log2_init: int, growth_interval: int):
        from ampviz.scaling import TorchGradScaler

        return TorchGradScaler(init_scale=2.0 ** int(log2_init), growth_interval=int(growth_interval))

    def overflow_flags(self) -> np.ndarray:
        """Each rank's own overflows as the controls give them: shape (ranks, steps), True only in
        the chosen rank's row, at the steps typed. ValueError when the text cannot be read."""
        s = dict(self._settings())
        return self._flags_of(s["ranks"], s["rank"], s["text"], s["steps"])

    @staticmethod
    def _flags_of(ranks: int, rank: int, text: str, steps: int) -> np.ndarray:
        flags = np.zeros((ranks, steps), bool)
        flags[rank] = parse_overflow_steps(text, steps)
        return flags

    def _settings(self, **changed) -> tuple:
        """The controls' values as a key (``changed`` replaces some); the overflowing rank is the
        last one when fewer ranks remain."""
        values = {"ranks": self.ranks_slider.value, "mode": self.mode_dropdown.value,
                  "rank": self.rank_dropdown.value, "text": self.steps_text.value,
                  "log2_init": self.init_slider.value, "interval": self.interval_input.value,
                  "steps": self.steps_input.value, "reduce": self.reduce_dropdown.value,
                  "log2_grad": self.grad_slider.value}
        values.update(changed)
        values["rank"] = min(int(values["rank"] or 0), values["ranks"] - 1)
        return tuple(values.items())

    # ----- react -----
    def _on_ranks(self, change) -> None:
        """The rank dropdown lists the ranks there are (the chosen one kept, or the last rank)."""
        ranks = int(change["new"])
        if len(self.rank_dropdown.options) == ranks:
            return
        rank = min(self.rank_dropdown.value or 0, ranks - 1)
        self._syncing = True
        try:
            self.rank_dropdown.options = self._rank_options(ranks)
            self.rank_dropdown.value = rank
        finally:
            self._syncing = False

    def _on_change(self, change) -> None:
        if self._syncing:
            return
        if isinstance(change, dict) and change.get("owner") is self.mode_dropdown:
            self.reduce_dropdown.disabled = self.mode_dropdown.value != "ddp"
        self._note_move(change, ((self.ranks_slider, "ranks"), (self.init_slider, "log2_init"),
                                 (self.grad_slider, "log2_grad")))
        self._request_update(change)  # at once from Python; coalesced from the browser

    def _drawn(self, **changed) -> tuple:
        """(trace, own overflows, readout, figure, prepared figure) for the controls' settings with
        ``changed`` applied, kept for reuse. ValueError for text that cannot be read."""
        key = self._settings(**changed)
        if (state := self._kept_state(key)) is not None:
            return state
        s = dict(key)
        if s["mode"] not in dict(self.MODES).values():  # a dropdown with nothing chosen holds None
            raise ValueError("choose how the ranks sync: DDP, a synced flag, a scaler per rank, or unscale_ "
                             "before the all-reduce")
        if s["reduce"] not in _REDUCE_NAMES:
            raise ValueError("choose the all-reduce dtype: fp32, fp16 or bf16")
        try:
            flags = self._flags_of(s["ranks"], s["rank"], s["text"], s["steps"])
        except ValueError as exc:
            raise _StepsNotRead(str(exc)) from None
        policy = self._policy_of(s["log2_init"], s["interval"])
        grad = 2.0 ** int(s["log2_grad"])
        trace = simulate_lab(policy, flags, grad, s["mode"], s["reduce"])
        label = dict((m, text) for text, m in self.MODES)[s["mode"]]
        title = f"{label}: {s['ranks']} ranks, {s['steps']:,} steps"
        note = ""
        if s["mode"] == "ddp":
            title += f", {s['reduce']} all-reduce"
            if s["reduce"] != "fp32":
                note = self._hook_note(trace, simulate_lab(policy, flags, grad, "ddp", "fp32"), flags, s["reduce"])
        elif s["reduce"] != "fp32":
            note = (f"The all-reduce dtype ({s['reduce']}) is a DDP comm hook: it acts in the DDP mode only; "
                    f"this mode keeps fp32 gradients.")
        fig = plot_ranks(trace, title=title)
        at = overflow_summary(flags[s["rank"]])
        applied = f"rank {s['rank']} " + ("never overflows" if at == "no step" else f"overflows at {at}")
        state = (trace, flags, self._readout_html(trace, note, applied), fig, FigureView.prepare(fig))
        return self._keep_state(key, state, self.KEPT_DRAWN)

    def update(self) -> None:
        """Simulate the ranks with the controls' settings and redraw. Text that cannot be read
        keeps the last good figure and table, and the message says so and what they show."""
        try:
            self.trace, self.found_inf, readout, fig, prepared = self._drawn()
        except _StepsNotRead as exc:
            shown = self._applied
            if shown is None:
                raise ValueError(str(exc)) from None
            rank, at, steps = shown
            what = "no overflow" if at == "no step" else f"rank {rank} overflowing at {at}"
            raise ValueError(f"{exc}. Not applied: the figure and table still show {what} (of {steps:,} "
                             f"steps)") from None
        s = dict(self._settings())
        self._applied = (s["rank"], overflow_summary(self.found_inf[s["rank"]]), s["steps"])
        self.readout.value = readout
        self._clear_error()
        self._draw(fig, prepared)

    # ----- the table -----
    @staticmethod
    def _hook_note(trace, fp32, flags, reduce_dtype: str) -> str:
        """What the hook changed (DDP mode): its skips against the fp32 all-reduce's, and the final scales."""
        cast = int((trace.found_inf[0] & ~flags.any(axis=0)).sum())
        limit = "65,520" if reduce_dtype == "fp16" else "about 3.4e38"
        return (f"With {_REDUCE_NAMES[reduce_dtype]} every rank skips {int(trace.skipped_count[0]):,} steps, "
                f"{cast:,} of them because a rank's S × max|g| reached {limit} at the cast (made before the "
                f"divide by the world size); the fp32 all-reduce skips {int(fp32.skipped_count[0]):,}. Final "
                f"scale {format_pow2(trace.final_scale[0])}; with fp32 {format_pow2(fp32.final_scale[0])}.")

    @staticmethod
    def _readout_html(trace, note: str = "", applied: str = "") -> str:
        div = trace.first_divergence
        summary = (f"Simulated: {applied}. " if applied else "") + (
            "The ranks' scales agree at every step." if div is None else
            f"The ranks' scales differ from step {div:,}.")
        poisoned = [f"rank {r} from step {t:,}" for r, t in enumerate(trace.poisoned_at) if t is not None]
        if poisoned:
            summary += " Weights inf/NaN: " + ", ".join(poisoned) + "."
        rows = []
        for r in range(trace.world_size):
            final = trace.final_scale[r]
            rows.append((f"rank {r}", html.escape(format_pow2(final)), f"{int(trace.overflow[r].sum()):,}",
                         f"{int(trace.skipped_count[r]):,}", f"{int(trace.nonfinite_step[r].sum()):,}"))
        head = ("rank", "final scale", "own overflows", "skipped steps", "steps on inf/NaN")
        extra = f"<div>{html.escape(note)}</div>" if note else ""
        return f"<div>{html.escape(summary)}</div>{extra}{_table(head, rows)}"
