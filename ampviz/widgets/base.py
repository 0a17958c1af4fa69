"""What every explorer shares: number parsing, argument checks, the error line and the base class."""

from __future__ import annotations

import functools
import html
import math
import re
import threading
from collections import OrderedDict


import ipywidgets as W

from ampviz._args import _count, _number
from ampviz.widgets.figureview import FigureView

#: Light tints of ``FIELD_COLORS`` for bits that are 0.


_FIELD_TINTS = {"sign": "#F3DDE9", "exponent": "#DDEFFA", "mantissa": "#FAEBCC"}
_ERROR_STYLE = "color:#B00020;font-weight:600"
_POW2 = re.compile(r"^([+-]?)2\s*(?:\^|\*\*)\s*\(?\s*([+-]?\d+)\s*\)?$")


def parse_number(text) -> float:
    """The number a learner typed: a decimal ("0.1", "1e-8", "65519"), a power of two ("2^-24",
    "2**-24"), "inf" or "nan". Raises ValueError with a readable message otherwise."""
    s = str(text).strip().replace("\u2212", "-")
    if not s:
        raise ValueError("type a number, e.g. 0.1, 1e-8, 65519, 2^-24, inf or nan")
    m = _POW2.match(s)
    if m:
        digits = m.group(2).lstrip("+-").lstrip("0")
        negative_k = m.group(2).startswith("-")
        # far beyond any float: no need to read the whole (possibly huge) exponent
        k = int(digits or "0") if len(digits) <= 6 else 10**7
        k = -k if negative_k else k
        try:
            v = math.ldexp(1.0, k)
        except OverflowError:
            v = math.inf
        return -v if m.group(1) == "-" else v
    try:
        return float(s)
    except ValueError:
        raise ValueError(
            f"could not read {_shown(s)} as a number: type a decimal such as 0.1, 1e-8 or 65519, "
            "a power of two such as 2^-24, or inf / nan"
        ) from None


def _wait_until_sent(timeout: float = 0.25) -> bool:
    """Wait (at most ``timeout`` seconds, the GIL released) until the kernel's IOPub thread has
    sent every message queued so far; True when it has, False outside a kernel or on timeout.

    A redraw's messages leave through that thread, which needs the GIL for each one: work done
    at once after a redraw (the next positions drawn ahead) held it, and the figure's message
    left up to 14 ms after it was queued (in Voila, BlockExplorer's outlier slider, measured in the
    kernel), a delay the learner sees on every move."""
    try:
        from ipykernel.kernelbase import Kernel

        if not Kernel.initialized():
            return False
        thread = getattr(Kernel.instance(), "iopub_thread", None)
        schedule = getattr(thread, "schedule", None)
        if schedule is None:
            return False
        sent = threading.Event()
        schedule(sent.set)  # run by that thread after the messages queued before it
        return sent.wait(timeout)
    except Exception:  # another kernel or version: nothing to wait for
        return False


def _shown(value, limit: int = 40) -> str:
    """``value`` as a message shows it: its repr on one line, cut to ``limit`` characters."""
    if isinstance(value, str):
        return repr(value) if len(value) <= limit else repr(value[:limit]) + f"… ({len(value):,} characters)"
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[:limit] + "…"


def _whole(name: str, value, lo: int, hi: int | None = None) -> int:
    """``value`` as an int in [lo, hi], or ValueError/TypeError saying what to pass."""
    return _count(name, value, lo, hi, shown=_shown)


def _real(name: str, value) -> float:
    return _number(name, value, shown=_shown)


def _table(head, rows) -> str:
    """A readout's table: ``head`` (column titles) and ``rows`` (cells), both already HTML, with
    space between the columns (a bare table in a widget's HTML has none: in Voila and JupyterLab
    "final scale" ran into "lowest scale")."""
    cell = 'style="padding: 0 1.2em 0 0; text-align: left"'
    top = "".join(f"<th {cell}>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td {cell}>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="ampviz-readout-table"><tr>{top}</tr>{body}</table>'


#: The narrowest a figure beside an explorer's controls is drawn: on a page too narrow for the
#: controls' column and this, the figure goes under the controls instead.
FIGURE_MIN_WIDTH = 560


def _beside(column, view, width: int) -> W.HBox:
    """An explorer's page: its controls, message line and readout (``column``, top to bottom) in a
    column ``width`` pixels wide, and the figure (``view``) beside it, taking the rest of the row.

    Stacked one under the other, the controls and readout of ScalerLab, Fp8ScalingLab and
    BlockExplorer pushed their figure's foot (or more) below a 900-pixel screen, so a learner
    moving a slider could not see the figure change. Side by side, the explorer is as tall as
    the taller of the two, and fits a 1400 × 900 screen, in Voila and in JupyterLab with its file
    browser open (a notebook's output is 968 pixels wide there: a column of 360, a gap of 16 and
    the figure's least, 560, fit). On a page narrower than that (a narrower window), the figure
    wraps under the controls."""
    left = W.VBox(list(column), layout=W.Layout(width=f"{width}px", flex=f"0 0 {width}px", margin="0 16px 0 0"))
    left.add_class("ampviz-controls")
    right = W.Box([view], layout=W.Layout(flex=f"1 1 {FIGURE_MIN_WIDTH}px", min_width="0"))
    right.add_class("ampviz-figure-side")
    return W.HBox([left, right], layout=W.Layout(flex_flow="row wrap", align_items="flex-start"))


def _in_column(text: str) -> str:
    """A readout's HTML as the controls' column shows it: its lines spaced as text's. An HTML
    widget takes the controls' line height (28 pixels in JupyterLab and Voila), and in a column
    360 pixels wide, where a table's cells wrap, a table of eight blocks grew taller than the
    figure beside it."""
    return f'<div class="ampviz-column-text" style="line-height:1.35">{text}</div>'


def _parse_bits(text) -> int:
    """A bit pattern typed as hex ("0x3C00", or "3C00": digits alone are hex, as the box says),
    binary ("0b0011110000000000") or octal ("0o36000")."""
    s = str(text).strip().replace("_", "").replace(" ", "")
    if not s:
        raise ValueError("type a bit pattern, e.g. 0x3C00 or 0b0011110000000000")
    try:
        return int(s, 0) if s[:2].lower() in ("0x", "0b", "0o") else int(s, 16)
    except ValueError:
        raise ValueError(f"could not read {_shown(str(text).strip())} as a bit pattern: type hex such as 0x3C00") from None


def _shows_errors(callback):
    """Run a widget callback; an exception becomes the explorer's message instead of a traceback."""

    @functools.wraps(callback)
    def wrapper(self, *args, **kwargs):
        try:
            return callback(self, *args, **kwargs)
        except Exception as exc:  # shown to the learner, kept on .error
            self._show_error(exc)
            return None

    return wrapper


class _Explorer:
    """What every explorer shares: a root widget ``ui``, a message line, and its figure in a
    ``FigureView`` (``view``) that is updated in place: each redraw sends the new traces, and the
    layout only when it changed.

    Moves that come from the browser faster than the explorer computes are coalesced: a slider's
    change arriving from the front end (``widget.set_state``, as the browser sends it) only marks
    the figure out of date, and a worker thread redraws it from the controls' newest values, so
    the intermediate positions are dropped and the last position always wins. A change made in
    Python (``slider.value = ...``) redraws at once, before the assignment returns."""

    ui: W.Widget
    #: Seconds the worker waits after a browser's move is sent before it draws the next positions
    #: ahead (a new move ends the wait): on two cores that work took the CPU from the server that
    #: relays the move and from the browser that draws it. In JupyterLab, moves made alternately
    #: with and without the wait repainted after (p50, timed in the page) 44 vs 57 ms for
    #: BlockExplorer and 34 vs 42 ms for ScalerLab; Fp8ScalingLab's moved alike (40 vs 38 ms).
    AHEAD_DELAY = 0.15

    def _init_common(self, *, view: bool = True) -> None:
        """``view=False``: the explorer shows its figures in views of its own (``view`` is None)."""
        self.error: str | None = None
        self.figure = None
        self.message = W.HTML(value="")
        self.message.add_class("ampviz-message")
        self.view = FigureView() if view else None
        self._update_lock = threading.RLock()  # one redraw at a time (worker or caller)
        self._queue_lock = threading.Lock()
        self._move_came = threading.Condition(self._queue_lock)  # notified when a browser's move is pending
        self._pending = False
        self._worker: threading.Thread | None = None
        self._drawn_states: OrderedDict = OrderedDict()  # settings -> what a redraw there shows
        self._moved = None  # (slider, its setting, +1 or -1): the slider the browser moved last, and which way

    def _kept_state(self, key):
        """What a redraw at settings ``key`` shows, if it was drawn before and is still kept (it
        becomes the most recent), else None."""
        state = self._drawn_states.get(key)
        if state is not None:
            self._drawn_states.move_to_end(key)
        return state

    def _keep_state(self, key, state: tuple, most: int) -> tuple:
        """Keeps ``state`` as what a redraw at settings ``key`` shows (the slider's next positions,
        drawn ahead, and recent ones); only the ``most`` most recent are kept. Returns ``state``."""
        self._drawn_states[key] = state
        while len(self._drawn_states) > most:
            self._drawn_states.popitem(last=False)
        return state

    @staticmethod
    def _recent(cache: OrderedDict, key, make, most: int):
        """``cache[key]``, made by ``make()`` when it is not there; only the ``most`` most recently
        used entries are kept."""
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        cache[key] = value = make()
        while len(cache) > most:
            cache.popitem(last=False)
        return value

    def _show_error(self, exc: BaseException) -> None:
        if isinstance(exc, (ValueError, TypeError, OverflowError)):
            text = str(exc)
        else:  # a bug, not the learner's input: still shown, never hidden
            text = f"internal error ({type(exc).__name__}): {exc}"
        self.error = text
        self.message.value = f'<span style="{_ERROR_STYLE}">⚠ {html.escape(text)}</span>'

    def _clear_error(self) -> None:
        self.error = None
        self.message.value = ""

    def _draw(self, fig, prepared=None) -> None:
        """Keep ``fig`` as ``.figure`` and show it in the view, in place of the previous one
        (``prepared``: ``FigureView.prepare(fig)``, made ahead of time). An explorer's ``update``
        calls it before it sets its readout: the figure's message then leaves first, and the
        browser starts plotly's draw, the slow part of a repaint, while the readout is on its way."""
        self.figure = fig
        self.view.update(fig if prepared is None else prepared)

    # ----- coalesced redraws -----
    def update(self) -> None:  # pragma: no cover - every explorer that coalesces defines it
        raise NotImplementedError

    def _request_update(self, change=None) -> None:
        """A control changed: redraw now (a change made in Python), or mark the figure out of date
        for the worker (a change from the browser, which may be followed by many more)."""
        owner = change.get("owner") if isinstance(change, dict) else None
        if getattr(owner, "_property_lock", None):
            with self._queue_lock:
                self._pending = True
                self._move_came.notify_all()
                if self._worker is not None:
                    return
                self._worker = threading.Thread(target=self._drain, name="ampviz-explorer-redraw",
                                                daemon=True)
                worker = self._worker
            worker.start()
        else:
            self._update_now()

    def _update_now(self) -> None:
        with self._update_lock:
            try:
                self.update()
            except Exception as exc:  # shown to the learner, kept on .error
                self._show_error(exc)

    def _wait_or_move(self, seconds: float) -> bool:
        """Wait ``seconds``, or less when a move comes; True when one came (it is pending)."""
        with self._move_came:
            return self._move_came.wait_for(lambda: self._pending, timeout=seconds)

    def _drain(self) -> None:
        idle_done = False
        while True:
            with self._queue_lock:
                redraw = self._pending
                if not redraw and idle_done:
                    self._worker = None
                    return
                self._pending = False
            if redraw:
                self._update_now()
                idle_done = False
                continue
            idle_done = True
            _wait_until_sent()  # the redraw's messages leave before the work ahead takes the GIL
            if self._wait_or_move(self.AHEAD_DELAY):  # and the front end takes them in and draws
                continue
            with self._update_lock:  # the wait is over and no move came: work ahead for the next
                try:
                    self._after_browser_update()
                except Exception:  # work ahead only: the next move computes what it needs
                    pass

    # ----- the moved slider's next positions, drawn ahead -----
    def _note_move(self, change, ahead) -> None:
        """``change`` came from the browser to one of the sliders ``ahead`` (pairs of a slider and
        the setting ``_drawn`` takes for it): remember which, and the way it went, so that
        ``_after_browser_update`` draws its next positions that way first."""
        owner = change.get("owner") if isinstance(change, dict) else None
        if not getattr(owner, "_property_lock", None):
            return
        name = next((n for slider, n in ahead if slider is owner), None)
        if name is None:
            return
        old, new = change.get("old"), change.get("new")
        position = (lambda v: list(owner.options).index(v)) if isinstance(owner, W.SelectionSlider) else float
        way = 1 if old is None or new is None or position(new) >= position(old) else -1
        self._moved = (owner, name, way)

    def _neighbour(self, slider, k: int):
        """The value ``k`` positions (arrow-key presses) from ``slider``'s, or None past its ends."""
        if isinstance(slider, W.SelectionSlider):
            i = list(slider.options).index(slider.value) + k
            return slider.options[i] if 0 <= i < len(slider.options) else None
        value = slider.value + k * slider.step
        return value if slider.min <= value <= slider.max else None

    def _after_browser_update(self) -> None:
        """Work to do once a browser's moves are drawn: the moved slider's next positions (the way
        it went first) drawn and packed ahead (``_drawn(**{setting: value})``), unless another move
        is waiting, so that the next press finds its figure made. Settings that cannot be drawn
        are skipped: the press shows why."""
        if self._moved is None:
            return
        slider, name, way = self._moved
        if slider.disabled:
            return
        for k in (way, -way):
            if self._pending:  # a move is waiting: it comes first
                return
            value = self._neighbour(slider, k)
            if value is None:
                continue
            try:
                self._drawn(**{name: value})
            except ValueError:
                continue

    def settle(self, timeout: float = 30.0) -> bool:
        """Wait until no redraw is pending or running (at most ``timeout`` seconds); True when
        the figure and readout show the controls' current values."""
        timeout = _real("timeout", timeout)
        if not timeout >= 0:
            raise ValueError(f"timeout must be a number of seconds, at least 0, got {_shown(timeout)}")
        import time

        end = time.monotonic() + min(timeout, 1e6)
        while True:
            with self._queue_lock:
                worker = self._worker
            if worker is None:
                return True
            left = end - time.monotonic()
            if left <= 0:
                return False
            worker.join(min(left, 0.05))

    def _repr_mimebundle_(self, **kwargs):
        return self.ui._repr_mimebundle_(**kwargs)
