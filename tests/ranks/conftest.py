"""The ranks tests' shared fixture: no test leaves a rank process behind."""

import time

import psutil
import pytest


@pytest.fixture(autouse=True)
def no_rank_left():
    """No process this test started is left (processes that earlier tests of the suite keep, such
    as a browser or a server kept for the whole test run, are not this test's)."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}

    def started_here(p) -> bool:
        # a process some earlier process started (a browser kept for the run starts renderers of
        # its own when it likes) is not this test's: only a chain from this process to it that
        # passes no earlier process makes it this test's
        try:
            return not any(a.pid in before for a in p.parents() if a.pid != me.pid)
        except psutil.Error:
            return False

    yield
    deadline = time.monotonic() + 5
    while True:
        kids = [p for p in me.children(recursive=True)
                if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE and started_here(p)]
        if not kids or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not kids, f"processes left behind: {kids}"
