"""FigureView's view in Chromium, rendered from its module with a stand-in for the widget model:
each revision is drawn in turn, and a view whose plotly.js is already on the page sends the kernel
nothing."""

from pathlib import Path

import plotly
import plotly.graph_objects as go

from ampviz.widgets.figureview import _ESM, _figure_parts, pack

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

# the module's render() with a model holding the given states in turn; returns what the view sent
# and what the page shows after each state is drawn
RENDER = """async ([src, states]) => {
  const mod = await import(URL.createObjectURL(new Blob([src], {type: "text/javascript"})));
  let state = states[0];
  const handlers = {}, sent = [], shown = [];
  const model = {
    get: (k) => state[k],
    on: (ev, f) => { (handlers[ev] = handlers[ev] || []).push(f); },
    off: (ev, f) => { handlers[ev] = (handlers[ev] || []).filter((g) => g !== f); },
    send: (msg) => { sent.push(msg); },
  };
  const el = document.getElementById("g");
  mod.default.render({model, el});
  const plot = () => el.querySelector(".js-plotly-plot");
  const drawn = (rev) => new Promise((resolve, reject) => {
    const t0 = performance.now();
    const poll = () => {
      const p = plot();
      if (p && p.dataset.revision === String(rev)) return setTimeout(resolve, 50);
      if (performance.now() - t0 > 20000) return reject(new Error("revision " + rev + " never drawn"));
      setTimeout(poll, 10);
    };
    poll();
  });
  for (let i = 0; i < states.length; i++) {
    if (i > 0) { state = states[i]; (handlers["change:revision"] || []).forEach((f) => f()); }
    await drawn(state.revision);
    const p = plot();
    shown.push({y: Array.from(p.data[0].y), text: el.textContent.includes("could not be drawn")});
  }
  return {sent, shown};
}"""


def _state(y, revision):
    data, layout = _figure_parts(go.Figure(go.Scatter(x=[0, 1, 2], y=y), layout={"xaxis": {"range": [0, 2]},
                                                                                   "yaxis": {"range": [0, 10]}}))
    return {"data": pack(data), "figure_layout": pack(layout), "config": {}, "revision": revision}


def test_each_revision_is_drawn_in_turn_and_nothing_is_sent(browser):
    page = browser.new_page()
    try:
        page.set_content('<div id="g" style="width:600px"></div>')
        page.add_script_tag(path=str(PLOTLY_JS))
        states = [_state([1, 2, 3], 1), _state([4, 5, 6], 2), _state([7, 8, 9], 5)]
        out = page.evaluate(RENDER, [_ESM, states])
    finally:
        page.close()
    assert [s["y"] for s in out["shown"]] == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert not any(s["text"] for s in out["shown"])
    assert out["sent"] == []
