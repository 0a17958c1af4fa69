"""Where a widget sits in an explorer's page (imported by the explorer tests: their folder is on
the path as pytest runs them)."""


def descendants(widget) -> list:
    """Every widget inside ``widget`` (its children, theirs, ...), ``widget`` first."""
    found, todo = [], [widget]
    while todo:
        w = todo.pop()
        found.append(w)
        todo.extend(reversed(list(getattr(w, "children", ()) or ())))
    return found


def contains(root, widget) -> bool:
    """Whether ``widget`` is shown inside ``root``."""
    return any(w is widget for w in descendants(root))
