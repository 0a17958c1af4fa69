"""ampviz.widgets.jsbundle: every browser module bundled into one text runs in Chromium as an ES
module and as a classic script, exporting what the module exports and computing the same; the
bundle refuses import forms it cannot link, circles and unknown modules in one line."""

import pytest

from ampviz.widgets import jsbundle
from conftest import JS_ORIGIN, js_module_page

MODULES = sorted(p.stem for p in jsbundle.JS_DIR.glob("*.mjs"))


@pytest.fixture(scope="module")
def page(browser):
    page = js_module_page(browser, "formats", "F")
    yield page
    page.close()


def test_each_bundle_exports_what_its_module_exports(page):
    for name in MODULES:
        text = jsbundle.bundle(name)
        assert "\nimport " not in "\n" + text, name  # nothing left to fetch
        got = page.evaluate("""async ([name, text]) => {
            const url = URL.createObjectURL(new Blob([text], {type: "text/javascript"}));
            const bundled = await import(url), direct = await import(`/js/${name}.mjs`);
            return [Object.keys(bundled).sort(), Object.keys(direct).sort()]; }""", [name, text])
        assert got[0] == got[1], name


def test_a_bundle_computes_as_its_modules_do(page):
    got = page.evaluate("""async ([fp8, classic]) => {
        const b = await import(URL.createObjectURL(new Blob([fp8], {type: "text/javascript"})));
        const d = await import("/js/fp8.mjs");
        const amax = [1, 3, 0.5, 1e-13, 448, 900, 2.0 ** -20];
        const s = (m) => JSON.stringify(Array.from(m.simulateDelayed(amax, {historyLen: 3}).scale));
        eval(classic);
        return [s(b), s(d), s(window.Fp8Classic)]; }""", [jsbundle.bundle("fp8"), jsbundle.classic("fp8", "Fp8Classic")])
    assert got[0] == got[1] == got[2] and len(got[0]) > 10


def test_the_classic_script_carries_a_default_export(page):
    keys = page.evaluate("(t) => { eval(t); return Object.keys(window.Fig); }", jsbundle.classic("figure", "Fig"))
    assert "default" in keys and "drawFigure" in keys


def test_a_module_exports_a_list_of_its_names_and_what_it_imports(page, tmp_path, monkeypatch):
    """``export { a, b as c };``: names declared in the module or imported into it (a re-export),
    in a bundled module, in the entry, and in the classic script."""
    monkeypatch.setattr(jsbundle, "JS_DIR", tmp_path)
    (tmp_path / "low.mjs").write_text('export function twice(x) { return 2 * x; }\n')
    (tmp_path / "mid.mjs").write_text('import { twice } from "./low.mjs";\nconst three = 3;\n'
                                      'export { twice, three as drei };\n')
    (tmp_path / "top.mjs").write_text('import { drei, twice } from "./mid.mjs";\nconst six = twice(drei);\n'
                                      'export { six, twice as double };\nexport const one = 1;\n')
    jsbundle.bundle.cache_clear()
    jsbundle.classic.cache_clear()
    try:
        module, classic = jsbundle.bundle("top"), jsbundle.classic("top", "Top")
    finally:
        jsbundle.bundle.cache_clear()
        jsbundle.classic.cache_clear()
    got = page.evaluate("""async ([module, classic]) => {
        const m = await import(URL.createObjectURL(new Blob([module], {type: "text/javascript"})));
        eval(classic);
        const shown = (x) => Object.keys(x).sort().map((k) => [k, typeof x[k] === "function" ? x[k](5) : x[k]]);
        return [shown(m), shown(window.Top)]; }""", [module, classic])
    assert got[0] == got[1] == [["double", 10], ["one", 1], ["six", 6]]


def test_what_it_cannot_link_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(jsbundle, "JS_DIR", tmp_path)
    (tmp_path / "a.mjs").write_text('import { b } from "./b.mjs";\nexport const a = 1;\n')
    (tmp_path / "b.mjs").write_text('import { a } from "./a.mjs";\nexport const b = 2;\n')
    (tmp_path / "c.mjs").write_text('import x from "./a.mjs";\nexport const c = 3;\n')
    (tmp_path / "d.mjs").write_text('import { e } from "./e.mjs";\nexport const d = e;\n')
    (tmp_path / "e.mjs").write_text('export var e = 1;\n')
    for entry, words in (("a", "import each other in a circle: a -> b -> a"), ("c", "cannot bundle the import"),
                         ("zz", "no browser module 'zz'"), ("d", "cannot bundle an export of e.mjs")):
        jsbundle.bundle.cache_clear()
        with pytest.raises(ValueError, match=words) as e:
            jsbundle.bundle(entry)
        assert "\n" not in str(e.value)
    jsbundle.bundle.cache_clear()


def test_origin_is_the_made_up_one():
    assert JS_ORIGIN.endswith(".invalid")
