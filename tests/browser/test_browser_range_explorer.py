"""BrowserRangeExplorer's front end in Chromium, with no kernel (the page's own model, as on a static
page): at every position of the scale slider, in every format it offers, over seeded value sets
(zeros of both signs, float32 subnormals, infinities, NaNs of both signs, values far below and far
beyond fp16's range, values on and beside every format's edges at every slider position), the
census, readout, scale label and figure the page computes equal the package's bit for bit; the
census does at every power of two float32 holds, in every format; the figure port equals
plot_census in every format with its legend and shares line too; a key press, a drag of the whole
slider, a format change and a model change redraw in the page and set the model; in JupyterLab the
kernel reads what the page moved. Each mutation test shows that a plausible wrong port differs from
the Python on this data."""

import base64
import html
import json
import math

import numpy as np
import pytest

from ampviz.formats import ALL_FORMATS
from ampviz.formats.census import census
from ampviz.plots import census_x_range, format_pow2, format_share, plot_census
from ampviz.plots.style import _template
from ampviz.widgets import RangeExplorer
from ampviz.widgets.browser_range_explorer import BrowserRangeExplorer
from conftest import (drawn, explorer_test_page, figure_dicts, lab_notebook_page, load_data, press_keys,
                      python_figure, python_side, python_side_cell, render, wait_drawn, wait_python_side)

FORMATS = BrowserRangeExplorer.FORMAT_CHOICES
NEG_NAN = np.array([0xFFC00000], np.uint32).view(np.float32)[0]
FIGURE = ".ampviz-census-figure"


@pytest.fixture(scope="module")
def page(browser):
    page = explorer_test_page(browser, "range_explorer_view", width=1100, CP="censusplot")
    page.evaluate(AS_JSON)
    yield page
    page.close()


# ----------------------------------------------------------------- value sets
def mixed(seed: int, n: int = 20_000) -> np.ndarray:
    """Values from 2^-60 to 2^40 (far below fp16's range and far beyond it), with zeros of both
    signs, float32 subnormals, infinities, NaNs of both signs and values past fp16's max."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.exp2(rng.uniform(-60, 40, n))).astype(np.float32)
    x[:40] = 0
    x[40:50] = -0.0
    x[50:150] = (2.0**-149 * rng.integers(1, 2**23, 100) * rng.choice([-1, 1], 100)).astype(np.float32)
    x[150:160] = np.inf
    x[160:165] = -np.inf
    x[165:170] = np.nan
    x[170:175] = NEG_NAN
    x[175:200] = rng.uniform(7e4, 3e38, 25).astype(np.float32)
    rng.shuffle(x)
    return x


def gradients(seed: int) -> np.ndarray:
    """ScalerLab's sample of gradients, signed: 2^-|N(0, 8)|."""
    rng = np.random.default_rng(seed)
    return (np.exp2(-np.abs(rng.normal(0.0, 8.0, 20_000))) * rng.choice([-1, 1], 20_000)).astype(np.float32)


def edges(ks=range(-16, 33)) -> np.ndarray:
    """Values whose products with 2^k land on and two float32 steps either side of every edge of
    every format offered: the underflow boundary, the tie that rounds up to the smallest normal,
    the smallest normal, max and the overflow boundary."""
    out = []
    with np.errstate(over="ignore", under="ignore"):
        for name in FORMATS:
            f = ALL_FORMATS[name]
            for b in (f.underflow_boundary, f.smallest_normal - f.smallest_subnormal / 2, f.smallest_normal, f.max,
                      f.overflow_boundary):
                t = np.float32(np.ldexp(b, -np.asarray(list(ks))))
                near = [t]
                for way in (np.float32(np.inf), np.float32(0)):
                    step = t
                    for _ in range(2):
                        step = np.nextafter(step, way)
                        near.append(step)
                out.append(np.concatenate(near))
    x = np.concatenate(out).astype(np.float32)
    return x[np.isfinite(x) & (x != 0)]


VALUE_SETS = {
    "mixed 0": lambda: mixed(0),
    "mixed 1": lambda: mixed(1, 5_000),
    "gradients": lambda: gradients(2),
    "edges": edges,
    "few": lambda: np.float32([1e-8, 1e-3, 1.0]),
    "none finite": lambda: np.array([0.0, -0.0, np.nan, np.inf, -np.inf, NEG_NAN], np.float32),
    "empty": lambda: np.zeros(0, np.float32),
}
#: The set whose figures are compared at every position (a figure costs Python ~20 ms); the others'
#: at the positions where the kernel's RangeExplorer is moved too.
FIGURE_SET = "mixed 0"
REF_POSITIONS = (-16, 0, 13, 32)


# ----------------------------------------------------------------- helpers
# (figures are compared as ``figure_dicts`` reads them, so that a test can compare a figure at every
# slider position in time; where both are read, they are checked equal to ``python_figure``'s)

#: In-page: ``asJson(value)``, the value as JSON has it (typed arrays as lists, NaN as null): a
#: page sends one string far faster than Playwright walks a large object.
AS_JSON = """() => { window.asJson = (v) => JSON.stringify(v, (k, x) => ArrayBuffer.isView(x) ? Array.from(x) : x);
    window.noTemplate = (fig) => ({data: fig.data, layout: {...fig.layout, template: undefined}}); }"""

#: In-page: every slider position in one format: census, readout, label, and the figure (less its
#: template) at the positions asked.
POSITIONS = """([fmt, figured]) => { const out = [];
    for (let k = D.lo; k <= D.hi; k++) { const r = V.compute(D, {fmt, log2_scale: k});
      out.push({counts: r.result.counts, bins: r.result.log2Bins, binCounts: r.result.log2Counts, total: r.result.total,
                scale: r.result.scale, readout: r.readout, label: r.label, xRange: r.xRange,
                figure: figured.includes(k) ? noTemplate(r.figure) : null}); }
    return asJson(out); }"""


def same_census(got: dict, want, where) -> None:
    assert got["counts"] == want.counts, where
    assert got["bins"] == want.log2_bins.tolist() and got["binCounts"] == want.log2_counts.tolist(), where
    assert got["total"] == want.total and float(got["scale"]) == want.scale, where


# ----------------------------------------------------------------- the numbers
def test_every_position_of_every_format_gives_the_packages_census_readout_and_figure(page):
    """Each value set, each format offered, each of the 49 slider positions: the page's census,
    readout and x range equal BrowserRangeExplorer's (the package's); its label and figure too at
    every position of the richest set, and at four positions of every set, where RangeExplorer
    itself is moved to the same settings and shows the same."""
    for name, make in VALUE_SETS.items():
        values = make()
        ex = BrowserRangeExplorer(values)
        load_data(page, ex)
        ref = RangeExplorer(values)  # moved by its own controls: what the kernel's explorer shows
        every = list(range(ex.log2_scale_min, ex.log2_scale_max + 1))
        assert len(every) == 49
        for fmt in FORMATS:
            figured = every if name == FIGURE_SET else list(REF_POSITIONS)
            got = json.loads(page.evaluate(POSITIONS, [fmt, figured]))
            ex.fmt = fmt
            for k, g in zip(every, got, strict=True):
                ex.log2_scale = k
                where = (name, fmt, k)
                same_census(g, ex.result, where)
                assert g["readout"] == ex.readout_html(), where
                assert tuple(g["xRange"]) == ex.x_range(), where
                if name == FIGURE_SET:
                    assert g["label"] == ex.scale_label(), where
                    assert g["figure"] == figure_dicts(ex.figure()), where
            # the kernel's explorer, moved to some of these positions: the same census, readout and figure
            for k in REF_POSITIONS:
                ref.format_dropdown.value, ref.scale_slider.value = fmt, k
                g = got[k - ex.log2_scale_min]
                same_census(g, ref.result, (name, fmt, k))
                assert g["readout"] == ref.readout.value and g["label"] == ref.scale_label.value
                assert g["figure"] == python_figure(ref.figure) == figure_dicts(ref.figure), (name, fmt, k)
    # plotly's template, which the page puts in the layout as plotly.py fills it in
    page_template = page.evaluate("() => V.compute(D, {fmt: 'fp16', log2_scale: 0}).figure.layout.template")
    assert page_template == RangeExplorer(np.ones(1)).figure.to_plotly_json()["layout"]["template"]
    assert page.errors == []


def test_the_census_equals_the_packages_at_every_power_of_two_in_every_format(page):
    """Every scale float32 holds (2^-149 to 2^127), every format of the package (the page's census
    holds for all of them, not only the four the explorer offers): products that float32 flushes
    to 0 or overflows to inf, and edges that fall inside float32's subnormal range."""
    values = np.concatenate([mixed(3, 2_000), edges(range(-149, 128, 3))])
    ex = BrowserRangeExplorer(values, log2_scale_range=(-149, 127))
    load_data(page, ex)
    got = json.loads(page.evaluate("""(names) => asJson(names.map((fmt) => { const out = [];
        for (let k = -149; k <= 127; k++) { const r = V.censusAt(D.prepared, fmt, k);
          out.push({counts: r.counts, bins: r.log2Bins, binCounts: r.log2Counts, total: r.total, scale: r.scale}); }
        return out; }))""", list(ALL_FORMATS)))
    for name, rows in zip(ALL_FORMATS, got):
        for k, g in zip(range(-149, 128), rows):
            same_census(g, census(ex.profile, name, 2.0**k), (name, k))
    # the label beside the slider at every one of these scales, as RangeExplorer._drawn writes it
    labels = page.evaluate("() => Array.from({length: 277}, (_, i) => CP.scaleLabel(2 ** (i - 149)))")
    assert labels == [f"scale = {html.escape(format_pow2(2.0**k))}" for k in range(-149, 128)]


def test_plot_census_is_ported_in_every_format_with_its_legend_and_shares(page):
    """plotCensus as plot_census draws a census of its own: every format, its default title and x
    range (from the bins), the legend and the shares line on and off, at scales where some band's
    share is under 1% (the shares line counts it) and where few values make every bar short; and
    at x ranges where an outer band's words only just miss fitting (room 68.5 pixels for fp16's
    "becomes 0", 69.4 wide; 114.7 for fp8 E4M3's "(ml_dtypes: NaN)", 117.1 wide), so that they
    move to the plot's edge, and where they only just fit (room 70.4): an estimate of a
    character's width a little off either way would draw them elsewhere."""
    template = _template("plotly_white")
    cases = []
    for i, values in enumerate((mixed(4, 3_000), np.float32([1e-8, 1e-3, 1.0, 3e4]))):
        for j, fmt in enumerate(ALL_FORMATS):
            k = (-20, 0, 7, 30)[(i + j) % 4]
            legend, shares = bool((i + j) % 2), bool((i + j) // 2 % 2)
            cases.append((values, fmt, k, legend, shares, None))
    cases += [(mixed(4, 3_000), "fp16", 0, False, False, [-26, 40]), (mixed(4, 3_000), "fp8_e4m3", 0, True, True, [-20, 14]),
              (mixed(4, 3_000), "fp16", 0, False, True, [-26, 28])]
    got = page.evaluate("""([cases, template]) => cases.map(([b64v, fmt, k, legend, shares, xRange]) => {
        const p = V.prepareValues(new Float32Array(bytesOf(b64v)));
        return asJson(noTemplate(CP.plotCensus(V.censusAt(p, fmt, k), {legend, shares, xRange, template}))); })""",
                        [[[base64.b64encode(v.tobytes()).decode(), f, k, lg, sh, xr] for v, f, k, lg, sh, xr in cases],
                         template])
    for (values, fmt, k, legend, shares, x_range), g in zip(cases, got):
        want = python_figure(plot_census(values, fmt, 2.0**k, legend=legend, shares=shares, x_range=x_range))
        assert json.loads(g) == want, (fmt, k, legend, shares, x_range)
    assert any("shares" in [a.get("name") for a in json.loads(g)["layout"]["annotations"]] for g in got)
    edge = [{a["name"]: a["x"] for a in json.loads(g)["layout"]["annotations"]} for g in got[-3:]]
    assert edge[0]["underflow-band"] == -26 and edge[1]["overflow-band"] == 14  # at the plot's edge
    assert edge[2]["underflow-band"] == -25  # at the band's edge


def numbers() -> list:
    """Doubles to write: powers of two, every format's constants, random doubles over 600 binades,
    and ties of two decimals."""
    rng = np.random.default_rng(5)
    out = [2.0**k for k in range(-160, 140)]
    for f in ALL_FORMATS.values():
        out += [f.max, f.overflow_boundary, f.underflow_boundary, f.smallest_normal, f.smallest_subnormal]
    out += (rng.standard_normal(1500) * np.exp2(rng.uniform(-300, 300, 1500))).tolist()
    out += [0.125, 0.375, 2.675, 1.005, 6.0, 7.5, 28.0, 1 + 2**-40, 1 - 2**-40, 0.1, -3.0, 1.0000001]
    return out


def test_the_text_helpers_write_numbers_as_python(page):
    xs = numbers()
    got = page.evaluate("""(xs) => xs.map((x) => [CP.formatPow2(x), CP.pow2Short(x), CP.formatFixed(x, 2),
        CP.formatShare(Math.abs(x) / 8)])""", xs)
    from ampviz.plots.text import _pow2_short
    for x, (p2, short, fixed, share) in zip(xs, got):
        assert p2 == format_pow2(x), x
        assert short == _pow2_short(x), x
        assert fixed == f"{x:.2f}", x
        assert share == format_share(abs(x) / 8), x
    # every share a census of up to 2,000 values can have
    pairs = [(c, n) for n in (1, 3, 7, 800, 2000) for c in range(n + 1)]
    got = page.evaluate("(pairs) => pairs.map(([c, n]) => CP.formatShare(c / n))", pairs)
    assert got == [format_share(c / n) for c, n in pairs]


def test_the_log2_of_every_format_constant_is_pythons(page):
    """The figure's band edges and marks are log2 of each format's constants: the page's correctly
    rounded log2 gives the C library's value for every one of them."""
    consts = [v for f in ALL_FORMATS.values() for v in (f.max, f.overflow_boundary, f.underflow_boundary,
                                                        f.smallest_normal, f.smallest_subnormal)]
    assert page.evaluate("(xs) => xs.map((x) => CP.log2(x))", consts) == [math.log2(v) for v in consts]


def test_bad_settings_are_refused_in_one_line(page):
    ex = BrowserRangeExplorer(np.float32([1.0, 2.0]))
    load_data(page, ex)
    errors = page.evaluate("""() => [{fmt: 'fp32', log2_scale: 0}, {fmt: 'fp16', log2_scale: 33},
        {fmt: 'fp16', log2_scale: 1.5}].map((s) => { try { V.compute(D, s); return null; } catch (e) { return e.message; } })""")
    assert errors == ["RangeExplorer shows fp16, bf16, fp8_e4m3, fp8_e5m2; got 'fp32'",
                      "log2_scale must be between -16 and 32, got 33", "log2_scale must be a whole number, got 1.5"]


# ----------------------------------------------------------------- in the page, drawn
def shown_figure(page) -> dict:
    """The figure plotly holds: its traces' points and the layout's axes and title."""
    return page.evaluate("""() => { const gd = document.querySelector('.ampviz-census-figure');
        return JSON.parse(JSON.stringify({data: gd.data.map((t) => ({x: t.x, y: t.y, hovertext: t.hovertext ?? null})),
          xrange: gd.layout.xaxis.range, yrange: gd.layout.yaxis.range, title: gd.layout.title.text},
          (k, v) => ArrayBuffer.isView(v) ? Array.from(v) : v)); }""")


def python_shown(ex) -> dict:
    fig = figure_dicts(ex.figure())
    return {"data": [{k: t.get(k) for k in ("x", "y", "hovertext")} for t in fig["data"]],
            "xrange": fig["layout"]["xaxis"]["range"], "yrange": fig["layout"]["yaxis"]["range"],
            "title": fig["layout"]["title"]["text"]}


def test_a_key_press_redraws_in_the_page_and_sets_the_model(page):
    page.errors.clear()
    ex = BrowserRangeExplorer(gradients(6))
    render(page, ex, FIGURE)
    assert shown_figure(page) == python_shown(ex)
    page.locator(".ampviz-scale-slider").focus()
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    wait_drawn(page, FIGURE, fmt="fp16", log2_scale=3)
    assert page.evaluate("() => M.get('log2_scale')") == 3
    ex.log2_scale = 3
    assert page.inner_html(".ampviz-census-readout") == ex.readout_html()
    assert page.inner_html(".ampviz-scale-label") == ex.scale_label()
    assert page.eval_on_selector(".ampviz-scale-value", "(s) => s.textContent") == "3"
    assert shown_figure(page) == python_shown(ex)
    assert page.errors == []


def test_a_drag_of_the_whole_slider_repaints_at_every_position_and_sets_the_model(page):
    """A drag sends an input event a frame: the readout and label follow each one at once, and the
    figure draws the newest position whenever plotly is free (the last one always). Then a slow
    drag back, each move drawn before the next: every figure drawn is the package's."""
    page.errors.clear()
    values = mixed(7)
    ex = BrowserRangeExplorer(values, log2_scale=-16)
    render(page, ex, FIGURE)
    seen = page.evaluate("""async () => { const s = document.querySelector(".ampviz-scale-slider");
        const fig = document.querySelector(".ampviz-census-figure"), drawn = [], readouts = [], moves = [];
        const watch = new MutationObserver(() => drawn.push({k: JSON.parse(fig.dataset.drawn).log2_scale,
          compute: Number(fig.dataset.computeMs), draw: Number(fig.dataset.drawMs), by: fig.dataset.drawnBy}));
        watch.observe(fig, {attributes: true, attributeFilter: ["data-drawn"]});
        for (let k = -15; k <= 32; k++) { const t = performance.now(); s.value = String(k); s.dispatchEvent(new Event("input"));
          moves.push(performance.now() - t);
          readouts.push([document.querySelector(".ampviz-census-readout").innerHTML, document.querySelector(".ampviz-scale-label").innerHTML]);
          await new Promise(requestAnimationFrame); }
        await new Promise((r) => setTimeout(r, 500)); watch.disconnect(); return {drawn, readouts, moves}; }""")
    assert drawn(page, FIGURE) == {"fmt": "fp16", "log2_scale": 32}
    assert page.evaluate("() => M.get('log2_scale')") == 32
    ks = [d["k"] for d in seen["drawn"]]
    assert set(ks) <= set(range(-15, 33)) and ks == sorted(ks) and len(ks) >= 10, ks
    assert any(d["by"] == "moving" for d in seen["drawn"])
    for k, (readout, label) in zip(range(-15, 33), seen["readouts"]):
        ex.log2_scale = k
        assert readout == ex.readout_html() and label == ex.scale_label(), k
    print(f"\nfast drag: {len(set(ks))} of 48 positions drawn; input handler p50 "
          f"{np.median(seen['moves']):.2f} ms (the census, readout and figure computed in it); "
          f"draw p50 {np.median([d['draw'] for d in seen['drawn']]):.1f} ms, max {max(d['draw'] for d in seen['drawn']):.1f} ms")
    # slowly back down, three positions a move: each drawn before the next move
    for k in range(29, -17, -3):
        page.eval_on_selector(".ampviz-scale-slider", "(s, k) => { s.value = String(k); s.dispatchEvent(new Event('input')); }", k)
        wait_drawn(page, FIGURE, fmt="fp16", log2_scale=k)
        ex.log2_scale = k
        assert shown_figure(page) == python_shown(ex), k
    assert page.evaluate("() => M.get('log2_scale')") == -16
    assert page.errors == []


def test_a_format_change_and_a_model_change_redraw_and_move_the_controls(page):
    page.errors.clear()
    ex = BrowserRangeExplorer(mixed(8, 3_000), log2_scale=5, log2_scale_range=(-4, 12))
    render(page, ex, FIGURE)
    assert page.eval_on_selector(".ampviz-scale-slider", "(s) => [s.min, s.max, s.value]") == ["-4", "12", "5"]
    page.select_option(".ampviz-format-dropdown", "bf16")
    wait_drawn(page, FIGURE, fmt="bf16", log2_scale=5)
    assert page.evaluate("() => M.get('fmt')") == "bf16"
    assert page.eval_on_selector(".ampviz-census-figure", "(d) => d.dataset.drawnBy") == "redrawing"
    ex.fmt = "bf16"
    assert shown_figure(page) == python_shown(ex)
    assert page.inner_html(".ampviz-census-readout") == ex.readout_html()
    # settings changed on the model (as Python changes them) move the controls and redraw
    page.evaluate("() => M.set('log2_scale', -3)")
    wait_drawn(page, FIGURE, fmt="bf16", log2_scale=-3)
    assert page.eval_on_selector(".ampviz-scale-slider", "(s) => s.value") == "-3"
    page.evaluate("() => M.set('fmt', 'fp8_e4m3')")
    wait_drawn(page, FIGURE, fmt="fp8_e4m3", log2_scale=-3)
    assert page.eval_on_selector(".ampviz-format-dropdown", "(s) => s.value") == "fp8_e4m3"
    ex.fmt, ex.log2_scale = "fp8_e4m3", -3
    assert shown_figure(page) == python_shown(ex)
    assert page.inner_html(".ampviz-census-readout") == ex.readout_html()
    assert page.inner_html(".ampviz-scale-label") == ex.scale_label()
    assert page.errors == []


# ----------------------------------------------------------------- wrong ports that the tests catch
def test_a_category_from_the_exact_product_would_be_caught(page):
    """Categories read off the exact product against the format's edges (no cast): the product
    just under the smallest normal that rounds up to it, and fp8 E4M3's tie at 464 that saturates
    to max (not past it), would land in the wrong band."""
    x = edges()
    ex = BrowserRangeExplorer(x)
    load_data(page, ex)
    got = page.evaluate("""() => { const out = []; const m = D.prepared.magnitudes;
        const f32 = (b) => new Float32Array(new Uint32Array([b]).buffer)[0];
        for (const fmt of D.formats) { const F = CP.bandEdges(fmt);
          for (let k = -16; k <= 32; k++) { const c = {underflow: 0, subnormal: 0, normal: 0, overflow: 0};
            for (const b of m) { const p = f32(b) * 2 ** k;
              c[p <= F.underflow[1] ? "underflow" : p < F.subnormal[1] ? "subnormal" : p < F.normal[1] ? "normal" : "overflow"]++; }
            out.push([fmt, k, c]); } }
        return out; }""")
    differ = 0
    for fmt, k, c in got:
        want = census(ex.profile, fmt, 2.0**k).counts
        differ += any(c[cat] != want[cat] for cat in c)
    assert differ > 0


def test_a_histogram_of_the_float32_product_would_be_caught(page):
    """Bins of the float32 product (rounded, flushed to 0 or overflowed) instead of the exact one
    differ at the scales where products leave float32's normal range."""
    ex = BrowserRangeExplorer(mixed(9, 4_000), log2_scale_range=(-149, 127))
    load_data(page, ex)
    got = page.evaluate("""() => { const m = D.prepared.magnitudes, out = [];
        const f32 = (b) => new Float32Array(new Uint32Array([b]).buffer)[0];
        for (const k of [-149, -120, -60, 0, 60, 100, 127]) { const bins = new Map();
          for (const b of m) { const p = Math.fround(f32(b) * 2 ** k);
            if (p > 0 && p < Infinity) { const e = Math.floor(Math.log2(p)); bins.set(e, (bins.get(e) || 0) + 1); } }
          const keys = [...bins.keys()].sort((a, b) => a - b); out.push([k, keys, keys.map((e) => bins.get(e))]); }
        return out; }""")
    differ = 0
    for k, bins, counts in got:
        want = census(ex.profile, "fp16", 2.0**k)
        differ += bins != want.log2_bins.tolist() or counts != want.log2_counts.tolist()
    assert differ > 0


def test_subnormal_values_binned_by_their_exponent_field_would_be_caught(page):
    """A float32 subnormal's exponent field is 0 whatever its binade: binned by the field alone,
    the 100 subnormal values of the mixed set would all fall in one bar."""
    ex = BrowserRangeExplorer(mixed(10))
    load_data(page, ex)
    got = page.evaluate("""() => { const bins = new Map();
        for (const b of D.prepared.magnitudes) { if (b === 0 || b >= 0x7f800000) continue;
          const e = (b >>> 23) - 127; bins.set(e, (bins.get(e) || 0) + 1); }
        const keys = [...bins.keys()].sort((a, b) => a - b); return [keys, keys.map((e) => bins.get(e))]; }""")
    want = census(ex.profile, "fp16", 1.0)
    assert got != [want.log2_bins.tolist(), want.log2_counts.tolist()]


def test_an_axis_from_the_bins_shown_would_be_caught():
    """plot_census's own default x range follows the bins: the explorer's axis holds every bin
    its slider reaches, so that it stays put while the scale moves."""
    ex = BrowserRangeExplorer(mixed(11))
    differ = 0
    for k in range(-16, 33, 4):
        ex.log2_scale = k
        bins = ex.result.log2_bins
        differ += census_x_range(ex.fmt, int(bins.min()), int(bins.max())) != ex.x_range()
    assert differ > 0


def test_bars_coloured_by_their_left_edge_would_be_caught(page):
    """A binade's bar takes the band of its middle: by its left edge, the binade that starts at the
    underflow boundary would be drawn as underflow."""
    ex = BrowserRangeExplorer(gradients(12))
    load_data(page, ex)
    bands = page.evaluate("""() => { const fig = V.compute(D, {fmt: 'fp16', log2_scale: 0}).figure, out = {};
        for (const t of fig.data) if (t.meta.kind === 'bars') out[t.meta.band] = Array.from(t.x).filter((x, i) => i % 5 === 0);
        return out; }""")
    f = ALL_FORMATS["fp16"]
    by_left = {e: "underflow" if e <= math.log2(f.underflow_boundary) else "subnormal" if e < math.log2(f.smallest_normal)
               else "normal" if e < math.log2(f.overflow_boundary) else "overflow"
               for e in ex.result.log2_bins.tolist()}
    assert any(by_left[int(e)] != band for band, lefts in bands.items() for e in lefts)


def test_to_precision_and_to_fixed_would_be_caught(page):
    """Number.prototype.toPrecision and toFixed round a tie up, Python's "{:.3g}" and "{:.2f}" to
    even: 12.25% of a census is "12.2%", 0.125 to two decimals "0.12"."""
    pairs = [(c, 2000) for c in range(2001)]
    got = page.evaluate("(pairs) => pairs.map(([c, n]) => { const p = 100 * c / n; return String(Number(p.toPrecision(3))) + '%'; })", pairs)
    assert any(g != format_share(c / n) for g, (c, n) in zip(got, pairs) if 0 < c < n)
    xs = [x for x in numbers() if math.isfinite(x) and abs(x) < 1e15]
    fixed = page.evaluate("(xs) => xs.map((x) => x.toFixed(2))", xs)
    assert any(g != f"{x:.2f}" for g, x in zip(fixed, xs))


def test_one_value_is_one_value_in_the_hover_and_the_readout(page):
    """A binade of one value says "1 value" in plot_census's hover (not "1 values"), and a census
    of one value "of 1 value" in the readout; the page writes the same."""
    ex = BrowserRangeExplorer(np.float32([1e-8, 1e-3, 1.0]))
    load_data(page, ex)
    hover = page.evaluate("() => V.compute(D, {fmt: 'fp16', log2_scale: 0}).figure.data[0].hovertext")
    assert hover == python_figure(ex.figure())["data"][0]["hovertext"]
    assert all("<br>1 value (" in h for h in hover)
    one = BrowserRangeExplorer(np.float32([0.5]))
    load_data(page, one)
    readout = page.evaluate("() => V.compute(D, {fmt: 'fp16', log2_scale: 0}).readout")
    assert readout == one.readout_html() and "of 1 value<" in readout


# ----------------------------------------------------------------- in JupyterLab, with a kernel
PY_SIDE = python_side_cell("explorer", ["fmt", "log2_scale"], '''
r = explorer.result
python_side.value = f"{explorer.fmt} {explorer.log2_scale} | {r.counts['underflow']:,} | {r.counts['normal']:,}"
''')


def test_in_jupyterlab_the_kernel_reads_what_the_page_moved(browser, tmp_path):
    """In JupyterLab, with a kernel: arrow keys move the slider (JupyterLab's notebook takes arrow
    keys that a control lets through), the page redraws at once, and the kernel's explorer holds
    the new scale and counts what the page's readout shows."""
    cells = ["import numpy as np\nfrom ampviz.widgets.browser_range_explorer import BrowserRangeExplorer\n"
             "rng = np.random.default_rng(0)\n"
             "explorer = BrowserRangeExplorer(np.exp2(-np.abs(rng.normal(0, 8, 20_000))).astype(np.float32) / 64)\n"
             "explorer", PY_SIDE]
    with lab_notebook_page(browser, tmp_path, cells, FIGURE, "fp16 0 |") as page:
        press_keys(page.locator(".ampviz-scale-slider").first, 2)
        wait_drawn(page, FIGURE, log2_scale=2)
        wait_python_side(page, "fp16 2 |")
        py = python_side(page)
        counts = page.evaluate("() => Array.from(document.querySelectorAll('.ampviz-census-readout small'))"
                               ".map((s) => s.innerText)")
        # the readout's counts: "(underflow)", "(subnormal)", "(normal)", "(overflow)", then "of 20,000 values"
        assert counts[0] == f"({py[1]})" and counts[2] == f"({py[2]})", (counts, py)

