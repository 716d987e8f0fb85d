"""Fixtures shared by every test folder."""

import os

import pytest
import torch

# Triton picks interpreter vs compiled for each kernel when dspark_kernels/ is first imported. On a CPU-only machine the
# kernel tests need the interpreter, and in a whole-suite run other modules (SGLang's, imported while collecting)
# must not touch Triton before our kernels are decorated, so decide here, before any test module is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import dspark_kernels  # noqa: F401
    except ImportError:  # triton missing: the kernel tests skip with the reason
        pass


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
