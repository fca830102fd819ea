"""Fixtures several test files share (each file opts in; nothing here applies by itself)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def one_torch_thread():
    """Small tensors: a second torch thread costs more than it gives on a shared 2-core machine
    (a 140^2 elastic forward took 27 s with two threads under load and 1.5 s with one).  Files
    opt in with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
