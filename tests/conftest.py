"""Fixtures shared by the test files."""

import pytest


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one intra-op thread for a module's tests (as the notebooks' setup cells run it),
    restored afterwards."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
