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
