"""Deep Gradient Compression (Lin et al., ICLR 2018) for PyTorch, over dgc's C++ core.

    import dgc.torch
    model = torch.nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0, weight_decay=0)
    state = dgc.torch.DGCState(model, optimizer, iterations_per_epoch=len(loader))
    model.register_comm_hook(state, dgc.torch.dgc_hook)

Errors raised by the core are the dgc.DGCError family (subclasses below), with the C++ messages.
"""

# torch first: it loads the libtorch that dgc._C links and registers the pybind11 types
# (Tensor, ProcessGroup) that dgc._C's arguments use.
import torch
import torch.distributed

from dgc import _C
from dgc._C import (
    CommError,
    DataError,
    DecodeError,
    DGCError,
    InvalidArgument,
    MismatchError,
    NumericError,
    Options,
    TimeoutError,
)

__all__ = [
    "CommError",
    "DataError",
    "DecodeError",
    "DGCError",
    "InvalidArgument",
    "MismatchError",
    "NumericError",
    "Options",
    "TimeoutError",
]


def _check_abi():
    """dgc._C sees torch's Tensor and ProcessGroup only when both use one pybind11 ABI."""
    ours = (_C._PYBIND11_BUILD_ABI, _C._PYBIND11_COMPILER_TYPE, _C._PYBIND11_STDLIB)
    theirs = tuple(
        getattr(torch._C, name, None)
        for name in ("_PYBIND11_BUILD_ABI", "_PYBIND11_COMPILER_TYPE", "_PYBIND11_STDLIB")
    )
    if None not in theirs and ours != theirs:
        raise ImportError(
            f"dgc._C was built with pybind11 ABI {ours} but this torch ({torch.__file__}) with "
            f"{theirs}: rebuild dgc against the torch this Python imports (DGC_PYTHON)"
        )


_check_abi()
