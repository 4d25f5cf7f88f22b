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

# The torch versions dgc supports: from SUPPORTED_TORCH[0] up to, not including, SUPPORTED_TORCH[1]
# (major, minor). Checked before dgc._C is loaded, whose C++ would otherwise fail obscurely.
SUPPORTED_TORCH = ((1, 13), (3, 0))


def _torch_version(text):
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return None


def _check_torch():
    found = _torch_version(torch.__version__)
    low, high = SUPPORTED_TORCH
    if found is None or not low <= found < high:
        raise ImportError(
            f"dgc supports torch {low[0]}.{low[1]} up to (not including) {high[0]}.{high[1]}, but this "
            f"Python imports torch {torch.__version__} ({torch.__file__}): install a supported torch"
        )


_check_torch()

try:
    from dgc import _C  # noqa: E402  (after the version check)
except ImportError as error:
    raise ImportError(
        f"dgc._C could not be loaded with torch {torch.__version__} ({error}); if torch changed "
        f"since dgc was installed, reinstall dgc against it, in the source checkout: "
        f"pip install --no-build-isolation --force-reinstall ."
    ) from error
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


def _check_built_against():
    """dgc._C links the libtorch it was compiled against: the same major.minor must be imported."""
    built = _torch_version(_C._TORCH_VERSION)
    found = _torch_version(torch.__version__)
    if built != found:
        raise ImportError(
            f"dgc._C was built against torch {_C._TORCH_VERSION} but this Python imports torch "
            f"{torch.__version__} ({torch.__file__}): reinstall dgc against it, in the source "
            f"checkout: pip install --no-build-isolation --force-reinstall ."
        )


_check_abi()
_check_built_against()
