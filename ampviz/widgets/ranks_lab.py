"""RanksLab: one loss scaler per rank, and how the ranks learn of each other's overflows."""

from __future__ import annotations

import html
import math
import re
from collections import OrderedDict

import numpy as np

import ipywidgets as W

from ampviz.figureview import FigureView
from ampviz.plots import format_pow2, plot_ranks

from ampviz.widgets.base import _Explorer, _real, _shown, _whole

_STEP_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$")
_STEP_CHARS_SHOWN = 20  # how much of a step list a message repeats


def _log2_init(init_scale, lo: int, hi: int) -> int:
    """log2 of ``init_scale``, a power of two from 2^lo to 2^hi (the slider moves in powers of two)."""
    x = _real("init_scale", init_scale)
    if x > 0 and math.isfinite(x):
        m, e = math.frexp(x)
        if m == 0.5 and lo <= e - 1 <= hi:
            return e - 1
    raise ValueError(f"init_scale must be a power of two from 2^{lo} to 2^{hi} (the slider moves in powers "
                     f"of two), got {_shown(init_scale)}")


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
    ``torch.amp.GradScaler``'s rule (``TorchGradScaler``) with these settings.

    State: ``trace`` (the ``RanksTrace``), ``found_inf`` (each rank's own overflows, the input to
    the simulation), ``figure`` (``plot_ranks``), ``error``. The readout is a table per rank:
    final scale, own overflows, skipped steps, steps on inf/NaN. Text that cannot be read, or a
    step beyond the run, shows a one-line message and keeps the last good figure and table.
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

    def __init__(self, ranks=4, *, mode="ddp", overflow_rank=1, overflow_steps="5, 20", init_scale=2.0**16,
                 growth_interval=10, steps=60):
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

        self.trace = None
        self.found_inf = None
        self._drawn_states: OrderedDict = OrderedDict()  # settings -> what a redraw shows
        self._nudged = None  # (slider, +1 or -1): the slider the browser moved last, and which way
        self._syncing = False  # the rank dropdown's options are being rebuilt
        style = {"description_width": "130px"}
        wide = W.Layout(width="420px")
        self.ranks_slider = W.IntSlider(value=ranks, min=self.RANKS_RANGE[0], max=self.RANKS_RANGE[1],
                                        description="ranks", style=style, layout=wide)
        self.mode_dropdown = W.Dropdown(options=list(self.MODES), value=mode, description="how ranks sync",
                                        style=style, layout=wide)
        self.rank_dropdown = W.Dropdown(options=self._rank_options(ranks), value=overflow_rank,
                                        description="overflow on", style=style)
        self.steps_text = W.Text(value=overflow_steps, description="at steps", style=style, layout=wide,
                                 placeholder="e.g. 5, 20 or 7-9, or a pattern ..x (repeats)")
        self.init_slider = W.IntSlider(value=log2_init, min=self.LOG2_INIT_RANGE[0], max=self.LOG2_INIT_RANGE[1],
                                       description="log2 init_scale", style=style, layout=wide)
        self.interval_input = W.BoundedIntText(value=growth_interval, min=1, max=self.MAX_INTERVAL,
                                               description="growth_interval", style=style)
        self.steps_input = W.BoundedIntText(value=steps, min=1, max=self.MAX_STEPS, description="steps",
                                            style=style)
        self.ranks_slider.observe(self._on_ranks, names="value")  # first: the rank dropdown follows
        for w, cls in ((self.ranks_slider, "count"), (self.mode_dropdown, "mode"),
                       (self.rank_dropdown, "overflow-rank"), (self.steps_text, "overflow-steps"),
                       (self.init_slider, "init"), (self.interval_input, "interval"),
                       (self.steps_input, "steps")):
            w.add_class(f"ampviz-ranks-{cls}")
            w.observe(self._on_change, names="value")
        self.readout = W.HTML()
        self.readout.add_class("ampviz-ranks-readout")
        self.view.add_class("ampviz-ranks-figure")
        self.ui = W.VBox([
            W.HBox([W.VBox([self.ranks_slider, self.mode_dropdown, self.rank_dropdown, self.steps_text]),
                    W.VBox([self.init_slider, self.interval_input, self.steps_input])],
                   layout=W.Layout(flex_flow="row wrap")),
            self.message, self.readout, self.view,
        ])
        self.ui.add_class("ampviz-ranks-lab")
        self.update()

    # ----- read the controls -----
    @staticmethod
    def _rank_options(ranks: int) -> list:
        return [(f"rank {r}", r) for r in range(ranks)]

    @property
    def mode(self) -> str:
        return self.mode_dropdown.value

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
                  "steps": self.steps_input.value}
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
        owner = change.get("owner") if isinstance(change, dict) else None
        if getattr(owner, "_property_lock", None) and isinstance(owner, W.IntSlider):
            old = change.get("old")
            self._nudged = (owner, 1 if old is None or change["new"] >= old else -1)
        self._request_update(change)  # at once from Python; coalesced from the browser

    def _drawn(self, **changed) -> tuple:
        """(trace, own overflows, readout, figure, prepared figure) for the controls' settings with
        ``changed`` applied, kept for reuse. ValueError for text that cannot be read."""
        from ampviz.ranks import simulate_ranks  # loads torch: only when a lab is made

        key = self._settings(**changed)
        if key in self._drawn_states:
            self._drawn_states.move_to_end(key)
            return self._drawn_states[key]
        s = dict(key)
        flags = self._flags_of(s["ranks"], s["rank"], s["text"], s["steps"])
        trace = simulate_ranks(self._policy_of(s["log2_init"], s["interval"]), found_inf=flags, mode=s["mode"])
        label = dict((m, text) for text, m in self.MODES)[s["mode"]]
        fig = plot_ranks(trace, title=f"{label}: {s['ranks']} ranks, {s['steps']:,} steps")
        state = (trace, flags, self._readout_html(trace), fig, FigureView.prepare(fig))
        self._drawn_states[key] = state
        while len(self._drawn_states) > self.KEPT_DRAWN:
            self._drawn_states.popitem(last=False)
        return state

    def update(self) -> None:
        """Simulate the ranks with the controls' settings and redraw (the last good figure and
        table stay on error)."""
        self.trace, self.found_inf, readout, fig, prepared = self._drawn()
        self.readout.value = readout
        self._clear_error()
        self._draw(fig, prepared)

    def _after_browser_update(self) -> None:
        """The moved slider's next positions (the way it moved first), drawn ahead unless another
        move is waiting."""
        if self._nudged is None:
            return
        slider, way = self._nudged
        name = {id(self.ranks_slider): "ranks", id(self.init_slider): "log2_init"}.get(id(slider))
        if name is None:
            return
        for k in (way, -way):
            if self._pending:  # a move is waiting: it comes first
                return
            value = slider.value + k
            if slider.min <= value <= slider.max:
                try:
                    self._drawn(**{name: value})
                except ValueError:
                    continue

    # ----- the table -----
    @staticmethod
    def _readout_html(trace) -> str:
        div = trace.first_divergence
        summary = ("The ranks' scales agree at every step." if div is None else
                   f"The ranks' scales differ from step {div:,}.")
        poisoned = [f"rank {r} from step {t:,}" for r, t in enumerate(trace.poisoned_at) if t is not None]
        if poisoned:
            summary += " Weights inf/NaN: " + ", ".join(poisoned) + "."
        rows = []
        for r in range(trace.world_size):
            final = trace.final_scale[r]
            rows.append(f"<tr><td>rank {r}</td><td>{html.escape(format_pow2(final))}</td>"
                        f"<td>{int(trace.overflow[r].sum()):,}</td><td>{int(trace.skipped_count[r]):,}</td>"
                        f"<td>{int(trace.nonfinite_step[r].sum()):,}</td></tr>")
        head = ("<tr><th>rank</th><th>final scale</th><th>own overflows</th><th>skipped steps</th>"
                "<th>steps on inf/NaN</th></tr>")
        return f"<div>{html.escape(summary)}</div><table>{head}{''.join(rows)}</table>"
