"""Shared pytest fixtures."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Run a test with one torch thread: the models in these tests are tiny, and on a busy 2-core machine two
    threads make them several times slower. Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
