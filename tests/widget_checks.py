"""Checks the explorer tests share (imported by the test files: tests/ is on the path as pytest runs
them): an error message is one readable line, a call is refused with one, and the visible text of
an HTML widget."""

import html
import re


def one_line(message) -> bool:
    """A message a learner can read: one nonempty line, no traceback, no "internal error"."""
    return isinstance(message, str) and message.strip() != "" and "\n" not in message \
        and "internal error" not in message and "Traceback" not in message


def refused(call) -> str | None:
    """None when ``call()`` succeeds, else its one-line ValueError/TypeError message (anything else fails)."""
    try:
        call()
    except (ValueError, TypeError) as e:
        assert one_line(str(e)), repr(str(e))
        return str(e)
    return None


def text(widget) -> str:
    """The visible text of an HTML widget: tags removed, entities read, spaces collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", widget.value)).split())


def move_quickly(explorer, slider: str, values, monkeypatch) -> list:
    """Moves ``explorer``'s control ``slider`` (an attribute name) through ``values`` as the browser
    sends them, faster than the explorer redraws (each redraw made 50 ms slower), and waits until it
    settles. Checks that the moves were coalesced (at most three redraws, not one a move) and that
    the last one was drawn last; returns the positions drawn."""
    import time

    calls = []
    original = type(explorer).update

    def slow_update(self):
        calls.append(getattr(self, slider).value)
        time.sleep(0.05)
        original(self)

    monkeypatch.setattr(explorer, "update", slow_update.__get__(explorer))
    for v in values:
        getattr(explorer, slider).set_state({"value": v})
    assert explorer.settle(30)
    assert 1 <= len(calls) <= 3 and calls[-1] == values[-1], calls  # not a redraw a move
    return calls
