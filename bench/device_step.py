"""One DGC compression step of the device compressor on ResNet-50's 25,557,032 floats, against
`torch.topk` of the same k and against one streaming pass over the same data (a copy: read n
floats, write n floats, the memory-bandwidth bound), all in this process on the same device; then
the bytes copied from the device to the host in one whole DDP training step with the DGC hook
(world size 1 over NCCL on a GPU), counted by the profiler. Prints one JSON line.

    bench/device_step.py [--device cuda|cpu] [--repeats N] [--numel N] [--density D]

The compression step is DeviceCompressor::step (python/device_compressor.h): momentum
correction, sampled threshold, selection, masking, as the hook runs it per tensor. Targets
(issue 40): step <= 3x the streaming pass, torch.topk >= 3x the step, and no full-gradient copy
to the host per training step (dtoh_bytes_per_step far below 4 * numel).
"""

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

import torch

import dgc
from dgc import _C

RESNET50_NUMEL = 25_557_032


def timer(device):
    """Seconds of fn(), synchronised with the device."""

    def run(fn, repeats):
        times = []
        for _ in range(repeats):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    return run


def compression(device, numel, density, repeats):
    time_of = timer(device)
    options = _C.Options(iterations_per_epoch=1, density=density)
    g = torch.Generator(device="cpu").manual_seed(0)
    grad = torch.randn(numel, generator=g).to(device)
    compressor = _C._DeviceCompressor([numel], options, density, str(device))
    for _ in range(2):  # warm-up: kernels loaded, velocity built up
        compressor.step(0, grad, density)
    step = time_of(lambda: compressor.step(0, grad, density), repeats)
    indices, _ = compressor.step(0, grad, density)
    k = min(numel, max(1, math.ceil(density * numel - 1e-9 * max(1.0, density * numel))))
    velocity = compressor.velocity(0)
    topk = time_of(lambda: torch.topk(velocity.abs(), k, sorted=False), repeats)
    target = torch.empty_like(grad)
    stream = time_of(lambda: target.copy_(grad), repeats)
    return {
        "numel": numel,
        "density": density,
        "k": k,
        "selected": int(indices.numel()),
        "step_ms": round(step * 1e3, 3),
        "topk_ms": round(topk * 1e3, 3),
        "stream_ms": round(stream * 1e3, 3),
        "stream_gb_per_s": round(8 * numel / stream / 1e9, 1),
        "step_over_stream": round(step / stream, 2),
        "topk_over_step": round(topk / step, 2),
    }


class ResNetSized(torch.nn.Module):
    """Parameters adding up to ResNet-50's 25,557,032 floats, in four matrices and two biases;
    the loss sum_i <p_i, x_i> leaves x_i in p_i.grad."""

    def __init__(self):
        super().__init__()
        shapes = [(2048, 4096), (1024, 8192), (512, 9 * 512 * 2), (1000, 2048)]
        used = sum(a * b for a, b in shapes)
        shapes.append((RESNET50_NUMEL - used - 1000 - 2048,))
        shapes += [(1000,), (2048,)]
        self.weights = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in shapes])

    def forward(self, grads):
        return sum((p * g).sum() for p, g in zip(self.weights, grads))


def training_step_copies(device):
    """Bytes copied device -> host in one DDP step with the DGC hook (world size 1, NCCL)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29581")
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    try:
        net = ResNetSized().to(device)
        assert sum(p.numel() for p in net.parameters()) == RESNET50_NUMEL
        model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[device.index])
        sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0, weight_decay=0)
        state = dgc.torch.DGCState(model, sgd, iterations_per_epoch=1, warmup_epochs=0,
                                   min_compress_numel=1024, compress_1d=True)
        model.register_comm_hook(state, dgc.torch.dgc_hook)
        grads = [torch.randn(p.shape, device=device) for p in net.parameters()]

        def step():
            sgd.zero_grad()
            model(grads).backward()
            sgd.step()

        step()  # warm-up
        torch.cuda.synchronize(device)
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as profile:
            step()
            torch.cuda.synchronize(device)
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "trace.json")
            profile.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f)
        events = events.get("traceEvents", events) if isinstance(events, dict) else events
        copies = [e for e in events if e.get("cat") == "gpu_memcpy" and "DtoH" in e.get("name", "")]
        counted = [e for e in copies if "bytes" in e.get("args", {})]
        dtoh = sum(e["args"]["bytes"] for e in counted)
        largest = max((e["args"]["bytes"] for e in counted), default=0)
        return {
            "compressor": state.compressor,
            "dtoh_copies_per_step": len(copies),
            "dtoh_bytes_per_step": dtoh if len(counted) == len(copies) else None,
            "largest_dtoh_bytes": largest,
            "gradient_bytes": 4 * RESNET50_NUMEL,
            "message_bytes": state.last_bytes["message"],
        }
    finally:
        torch.distributed.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--numel", type=int, default=RESNET50_NUMEL)
    parser.add_argument("--density", type=float, default=0.001)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/device_step.py: no CUDA device (torch.cuda.is_available() is False); "
              "--device cpu runs the same measurement on the CPU", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cpu":
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    result.update(compression(device, args.numel, args.density, args.repeats))
    if device.type == "cuda":
        result.update(training_step_copies(device))
        full = result["dtoh_bytes_per_step"]
        result["no_full_gradient_copy"] = (
            None if full is None else result["largest_dtoh_bytes"] < result["gradient_bytes"] // 100)
    result["targets"] = {
        "step_at_most_3x_stream": result["step_over_stream"] <= 3.0,
        "topk_at_least_3x_step": result["topk_over_step"] >= 3.0,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
