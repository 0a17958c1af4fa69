// A widget model held by the page itself, for a front end shown with no kernel (a static page of
// the course): the widget's saved state, get and set, change events, and a save that goes nowhere.
// It answers the part of anywidget's model that the explorers' front ends use.

/** A model over ``state`` (a plain object: the widget's synced state by name). */
export function pageModel(state) {
  const values = { ...state };
  const handlers = new Map();
  const emit = (event, ...args) => { for (const f of [...(handlers.get(event) || [])]) f(...args); };
  return {
    get: (name) => values[name],
    set(name, value) {
      if (values[name] === value) return;
      values[name] = value;
      emit(`change:${name}`, value);
    },
    save_changes() {},
    send() {},
    on(event, f) { if (!handlers.has(event)) handlers.set(event, []); handlers.get(event).push(f); },
    off(event, f) {
      const list = handlers.get(event);
      if (!list) return;
      const k = list.indexOf(f);
      if (k >= 0) list.splice(k, 1);
    },
  };
}
