"""ExplorerApp: every explorer on one page (the explorer app)."""

from __future__ import annotations

import html
import threading

import numpy as np

import ipywidgets as W

from ampviz import scaling
from ampviz.widgets.base import _ERROR_STYLE, _real, _shown, _whole
from ampviz.widgets.block_explorer import BlockExplorer
from ampviz.widgets.format_explorer import FormatExplorer
from ampviz.widgets.fp8_lab import Fp8ScalingLab
from ampviz.widgets.live_trainer import LiveTrainer
from ampviz.widgets.range_explorer import RangeExplorer
from ampviz.widgets.scaler_lab import ScalerLab


def _course_gradients(seed: int) -> np.ndarray:
    """The weight gradients of the course's seeded model (notebook 02's), on one torch thread."""
    from ampviz.training.beam import gradients  # torch: imported here, never with ampviz.widgets

    _one_torch_thread()
    return np.asarray(gradients(seed).all, dtype=np.float32)


def _one_torch_thread() -> None:
    # The app's kernel is its own: one intra-op thread, as in the notebooks' setup cells. The tiny
    # models train several times faster so on a small machine (JupyterLab on 2 cores: 45 steps/s
    # with torch's default 2 threads, 220 with 1), and the gradients are notebook 02's to the bit
    # (a float sum depends on the thread count). It reaches every thread that runs its first torch
    # op afterwards (the live trainer's); a thread that already ran one keeps its count.
    import torch

    torch.set_num_threads(1)


def _reason(exc: BaseException) -> str:
    """``exc`` as one line, as an explorer's message line words it."""
    text = " ".join(str(exc).split())
    if isinstance(exc, (ValueError, TypeError, OverflowError)):
        return text
    return f"internal error ({type(exc).__name__}): {text}"


# ----- the explorer app: every explorer on one page -----
class ExplorerApp:
    """The explorers on one page, a tab each: the explorer app (``notebooks/explorer.ipynb``,
    served as a page by Voila with ``make explorer``).

    Tabs: ``formats`` (a ``FormatExplorer``), ``ranges`` (a ``RangeExplorer`` over ``gradients``),
    ``scaling`` (a ``ScalerLab`` of ``steps`` steps, its lost share measured on the same
    ``gradients``; ``overlay`` names other frameworks' scalers to draw from the start, none by
    default, since each one adds tens of milliseconds to every slider move at a million steps),
    ``fp8`` (an ``Fp8ScalingLab``: delayed scaling over 16 steps), ``blocks`` (a ``BlockExplorer``:
    MXFP4 with an outlier) and ``training`` (a ``LiveTrainer``; ``live=False`` leaves it out).
    ``gradients`` default to the weight gradients of the course's seeded model
    (``ampviz.training.beam.gradients(seed)``, as in notebook 02). With either of those, the app sets torch
    to one intra-op thread, as the notebooks' setup cells do.

    The page comes up at once: the Formats tab (no torch) is built before the constructor returns,
    and the other tabs after it, in a background thread, in tab order (torch's import, the
    gradients, a million simulated steps: a few seconds). That thread starts once a front end
    shows the app (the browser then loads the Formats tab's widgets alone, not every tab's), or
    earlier when a tab is selected or ``wait_ready()`` is called, and at the latest
    ``BUILD_AFTER`` seconds after the constructor (for a front end that does not count views).
    Until its explorer is ready a tab shows a "Preparing ..." line; a tab selected early shows its
    explorer as soon as it is built. A tab whose explorer cannot be built shows why in one line,
    and ``errors`` maps its title to that line. Until then ``ranges``, ``scaling``, ``fp8``,
    ``blocks``, ``training`` (and ``gradients``, when computed here) are None; ``wait_ready()`` waits until every tab is
    built. ``explorers`` lists the explorers built so far, in tab order; ``tabs`` is the
    ``ipywidgets.Tab``, ``ui`` the whole app.
    """

    TITLES = ("Formats", "Ranges", "Loss scaling", "FP8 scaling", "Block scaling", "Live training")
    INTRO = ("<i>Formats</i>: click bits or type a number and see what fp16, bf16, fp8 or tf32 store. "
             "<i>Ranges</i>: slide the loss scale and watch real gradients leave the underflow band. "
             "<i>Loss scaling</i>: a dynamic loss scaler on a million steps; compare it with other frameworks'. "
             "<i>FP8 scaling</i>: a scale per tensor, from its own amax or a history of them. "
             "<i>Block scaling</i>: MX and NVFP4, a scale per block of 16 or 32 values. "
             "<i>Live training</i>: train a small model in several precisions at once and steer its scaler.")

    #: The largest seed (the FP8 and block explorers' streams take 32-bit seeds).
    MAX_SEED = 2**32 - 1
    #: Seconds after which the other tabs are built even if no view of the app was counted.
    BUILD_AFTER = 10.0

    def __init__(self, *, gradients=None, steps=1_000_000, live=True, seed=0, overlay=()):
        # every setting is checked now, not later in the background where its tab is built
        self.steps = _whole("steps", steps, 1, 10**8)
        self.seed = _whole("seed", seed, 0, self.MAX_SEED)
        if not isinstance(live, bool):
            raise TypeError(f"live must be True (with the Live training tab) or False, got {_shown(live)}")
        self.live = live
        names = (overlay,) if isinstance(overlay, str) else overlay
        try:
            names = tuple(names)
        except TypeError:
            raise TypeError(f"overlay must be a list of scaler names, e.g. ['fairseq'], "
                            f"got {_shown(overlay)}") from None
        unknown = [name for name in names
                   if not isinstance(name, str) or name not in scaling.PRESETS or name == "torch"]
        if unknown:
            raise ValueError(f"cannot compare with {_shown(unknown[0])}; choose from "
                             f"{', '.join(n for n in scaling.PRESETS if n != 'torch')}")
        self._overlay = names
        self.gradients = None if gradients is None else np.asarray(gradients, dtype=np.float32)

        self.formats = FormatExplorer("fp16", value=0.1)
        self.ranges: RangeExplorer | None = None
        self.scaling: ScalerLab | None = None
        self.fp8: Fp8ScalingLab | None = None
        self.blocks: BlockExplorer | None = None
        self.training: LiveTrainer | None = None
        self.explorers: list = [self.formats]
        self.errors: dict[str, str] = {}
        titles = self.TITLES if live else self.TITLES[:-1]
        # a tab's box holds its "Preparing ..." line until its explorer is built, then the explorer
        self._status = {}
        self._boxes = {}
        for title in titles[1:]:
            line = W.HTML(value=f"<i>Preparing the {html.escape(title)} tab…</i>")
            line.add_class("ampviz-tab-status")
            self._status[title] = line
            self._boxes[title] = W.VBox([line])
        self.tabs = W.Tab(children=[self.formats.ui, *self._boxes.values()], titles=titles)
        self.tabs.add_class("ampviz-explorer-tabs")
        self.intro = W.HTML(value=self.INTRO)
        self.intro.add_class("ampviz-explorer-intro")
        self.ui = W.VBox([self.intro, self.tabs])
        self.ui.add_class("ampviz-explorer-app")

        # The other tabs are built in the background once the page shows the app (its first view:
        # the front end counts the views of ``ui``), so that the browser first loads the Formats
        # tab's widgets alone; or earlier, when a tab is selected, wait_ready() is called, or
        # BUILD_AFTER seconds have passed (a front end that does not count views).
        self._done = threading.Event()
        self._start_lock = threading.Lock()
        self._builder: threading.Thread | None = None
        self.ui._view_count = 0
        self.ui.observe(self._on_shown, names="_view_count")
        self.tabs.observe(self._on_tab, names="selected_index")
        self._timer = threading.Timer(self.BUILD_AFTER, self._start_building)
        self._timer.daemon = True
        self._timer.start()

    # ----- the tabs after the first, built in the background -----
    def _start_building(self) -> None:
        with self._start_lock:
            if self._builder is not None:
                return
            self._builder = threading.Thread(target=self._build_the_rest, name="ampviz-explorer-app", daemon=True)
        self._timer.cancel()
        self._builder.start()

    def _on_shown(self, change) -> None:
        if change["new"]:
            self._start_building()

    def _on_tab(self, change) -> None:
        self._start_building()

    def _build_the_rest(self) -> None:
        try:
            gradients_error = None
            if self.gradients is None:
                try:
                    self.gradients = _course_gradients(self.seed)
                except Exception as exc:
                    gradients_error = exc
            self._build("Ranges", "ranges", gradients_error, lambda: RangeExplorer(
                # up to 2^36: past the largest safe scale of the default gradients (2^33)
                self.gradients, fmt="fp16", log2_scale=0, log2_scale_range=(-16, 36)))
            self._build("Loss scaling", "scaling", gradients_error, lambda: ScalerLab(
                steps=self.steps, scenario="spikes", strength=0.5, gradients=self.gradients, seed=self.seed,
                overlay=self._overlay))
            # numpy only: built whatever happened to torch or the gradients
            self._build("FP8 scaling", "fp8", None, lambda: Fp8ScalingLab(history_len=16, seed=self.seed))
            self._build("Block scaling", "blocks", None, lambda: BlockExplorer("fp4_e2m1", seed=self.seed))
            if self.live:
                torch_error = None
                try:
                    _one_torch_thread()
                except Exception as exc:
                    torch_error = exc
                # the beam model: fp32 and fp16+scaler learn, fp16 alone stalls (ampviz.training.beam)
                self._build("Live training", "training", torch_error, lambda: LiveTrainer(
                    modes=("fp32", "fp16", "fp16+scaler"), model="beam", steps=300, seed=self.seed))
        except Exception as exc:  # a bug here: still shown in every tab not built yet, never lost
            for title in self._boxes:
                if title not in self.errors and self._boxes[title].children == (self._status[title],):
                    self._fail(title, exc)
        finally:
            self._done.set()

    def _build(self, title: str, name: str, blocked_by: BaseException | None, make) -> None:
        if blocked_by is not None:
            self._fail(title, blocked_by)
            return
        try:
            explorer = make()
        except Exception as exc:
            self._fail(title, exc)
            return
        setattr(self, name, explorer)
        self.explorers = [e for e in (self.formats, self.ranges, self.scaling, self.fp8, self.blocks, self.training)
                          if e is not None]
        self._boxes[title].children = (explorer.ui,)

    def _fail(self, title: str, exc: BaseException) -> None:
        reason = _reason(exc)
        self.errors[title] = reason
        self._status[title].value = (f'<span style="{_ERROR_STYLE}">⚠ The {html.escape(title)} tab could not be '
                                     f'prepared: {html.escape(reason)}</span>')

    # ----- waiting for the tabs -----
    @property
    def ready(self) -> bool:
        """True once every tab shows its explorer (False while tabs are built, or when one failed)."""
        return self._done.is_set() and not self.errors

    def wait_ready(self, timeout=None) -> ExplorerApp:
        """Wait until every tab is built; returns the app. ``timeout``: seconds to wait at most
        (None: as long as it takes). Raises TimeoutError when the tabs are not built in time, and
        RuntimeError naming each tab that could not be built, with its reason."""
        if timeout is not None:
            timeout = _real("timeout", timeout)
            if not timeout >= 0:
                raise ValueError(f"timeout must be a number of seconds, at least 0 (or None), got {_shown(timeout)}")
        self._start_building()
        if not self._done.wait(None if timeout is None else min(timeout, 1e6)):
            raise TimeoutError(f"the explorer app's tabs were not all built within {timeout:g} s")
        if self.errors:
            raise RuntimeError("; ".join(f"the {title} tab could not be prepared: {reason}"
                                         for title, reason in self.errors.items()))
        return self

    def _repr_mimebundle_(self, **kwargs):
        return self.ui._repr_mimebundle_(**kwargs)
