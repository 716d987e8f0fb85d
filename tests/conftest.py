"""Fixtures shared by every test folder."""

import pytest
import torch


@pytest.fixture(scope="module")
def single_thread():
    """One intra-op thread for a whole test module (opt in: `pytestmark = pytest.mark.usefixtures("single_thread")`).

    Tiny tensors on a shared 2-core box: OpenMP hand-offs and pool wake-ups cost more than they save (4-10x slower
    under load). The previous thread count comes back when the module is done.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
