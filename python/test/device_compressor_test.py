"""The device compressor (python/device_compressor.h) against the core's Compressor: one step of
each from the same momentum, velocity, gradient and RNG seed must give the same selected indices,
the same sent values and the same u and v, bit for bit, over sizes, densities, both selection
methods, plain and Nesterov momentum, masking on and off, the three value types, and data made
to hit the corner cases (ties at the threshold, zeros, threshold decay rounds, hierarchical
selection, everything selected). The sampled selection is the same set because the threshold is
the same float (it is printed next to the core's).

    device_compressor_test.py [--device cpu|cuda]
"""

import argparse
import itertools
import sys

import torch

import dgc
from dgc import _C


def data(kind, n, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "normal":
        x = torch.randn(n, generator=g)
        x[torch.randint(0, n, (max(1, n // 500),), generator=g)] *= 30
    elif kind == "ties":  # few distinct magnitudes: many ties at the k-th largest
        x = torch.randint(-3, 4, (n,), generator=g).float()
    elif kind == "sparse":  # mostly zeros: fewer non-zeros than k at high density
        x = torch.randn(n, generator=g) * (torch.rand(n, generator=g) < 0.05)
    elif kind == "flat":  # one huge element: the sample misses it, decay rounds follow
        x = torch.full((n,), 1e-3)
        x[n // 3] = 1e3
    elif kind == "large":  # beyond fp16's range: saturation
        x = torch.randn(n, generator=g) * 1e5
    else:
        raise ValueError(kind)
    return x


def compare(device, n, density, kind, options_kwargs, seed):
    options = _C.Options(iterations_per_epoch=1, **options_kwargs)
    grad = data(kind, n, seed).to(device)
    momentum = (data("normal", n, seed + 1) * 0.1).to(device)
    velocity = (data(kind, n, seed + 2) * 0.5).to(device)
    got, reference = _C._compare_device_step(grad, momentum, velocity, options, density, seed)
    names = ("indices", "values", "momentum", "velocity", "threshold", "rounds", "hierarchical")
    for name, mine, core in zip(names, got, reference):
        if not isinstance(mine, torch.Tensor):
            if mine != core:
                raise AssertionError(f"n={n} density={density} {kind} {options_kwargs} seed={seed}: "
                                     f"{name} {mine} on the device, {core} in the core")
            continue
        if mine.shape != core.shape or not torch.equal(mine, core):
            detail = ""
            if name == "indices":
                a, b = set(mine.tolist()), set(core.tolist())
                detail = f"; only device: {sorted(a - b)[:5]}, only core: {sorted(b - a)[:5]}"
            raise AssertionError(
                f"n={n} density={density} {kind} {options_kwargs} seed={seed}: {name} differ "
                f"(device {tuple(mine.shape)}, core {tuple(core.shape)}){detail}"
            )
    HIT["rounds"] += got[5] > 0
    HIT["hierarchical"] += got[6]
    return got[0].numel()


# How many cases took threshold-decay rounds or the hierarchical top-k: both must occur, or the
# test would not reach those branches.
HIT = {"rounds": 0, "hierarchical": 0}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    device = parser.parse_args().device
    torch.set_num_threads(1)
    cases = 0
    selected = 0
    sizes = (1, 100, 10_000, 100_003)
    densities = (1.0, 0.1, 0.01, 0.001)
    kinds = ("normal", "ties", "sparse", "flat")
    for n, density, kind, selection in itertools.product(sizes, densities, kinds, ("sampled", "exact")):
        for nesterov, masking in ((False, True), (True, True), (False, False)):
            selected += compare(device, n, density, kind,
                                dict(selection=selection, nesterov=nesterov, masking=masking), seed=cases)
            cases += 1
    for value_type, kind in itertools.product(("fp16", "bf16"), ("normal", "large", "ties")):
        for density in (0.1, 0.001):
            selected += compare(device, 100_003, density, kind, dict(value_type=value_type), seed=cases)
            cases += 1
    # A sample ratio that keeps the sample small: the 0.8k / 1.3k adaptation does the work.
    for kind in ("normal", "ties", "flat"):
        selected += compare(device, 100_003, 0.01, kind, dict(sample_ratio=0.001), seed=cases)
        cases += 1

    # A NaN gradient is refused, as by the core.
    options = _C.Options(iterations_per_epoch=1)
    bad = torch.randn(1000)
    bad[17] = float("nan")
    try:
        _C._compare_device_step(bad.to(device), torch.zeros(1000, device=device),
                                torch.zeros(1000, device=device), options, 0.01, 0)
    except dgc.NumericError as error:
        if "non-finite velocity at index 17" not in str(error):
            raise AssertionError(f"NaN: {error}")
    else:
        raise AssertionError("a NaN gradient was not refused")
    if not all(HIT.values()):
        raise AssertionError(f"corner cases not reached: {HIT}")
    print(f"device compressor on {device}: {cases} cases equal to the core bit for bit "
          f"({selected} elements selected in all; {HIT['rounds']} with threshold decay rounds, "
          f"{HIT['hierarchical']} hierarchical)")


if __name__ == "__main__":
    sys.exit(main())
