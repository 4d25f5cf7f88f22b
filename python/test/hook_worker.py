"""One rank of the DDP hook tests; started by spawn_ranks.py or by torchrun (RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT in the environment). Every check compares against an independent
result: the C++ DistributedOptimizer over the same process group, plain DDP, or the run that was
not interrupted. Exits non-zero (with the reason) on the first failed check.

    hook_worker.py equivalence | dense | buckets | resume | errors | nonfinite | device
                   [--device cpu|cuda] [--backend gloo|nccl]

--device cuda puts each rank's model on GPU LOCAL_RANK % count (the "device" case then compares
the device compressor on CUDA tensors with the core on the CPU); --backend nccl exchanges over
NCCL.
"""

import argparse
import io
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import dgc
import dgc.torch

STEPS = 6
LR = 0.1


class FixedGradients(torch.nn.Module):
    """A model whose loss is sum_i <p_i, G_i>: backward() leaves exactly G_i in p_i.grad.

    Shapes: two compressed tensors (2-D and 3-D, >= 1024 elements), a bias and a small 2-D tensor
    (dense path).
    """

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.weight = torch.nn.Parameter(torch.randn(64, 40, generator=g))
        self.bias = torch.nn.Parameter(torch.randn(64, generator=g))
        self.conv = torch.nn.Parameter(torch.randn(8, 4, 40, generator=g))
        self.small = torch.nn.Parameter(torch.randn(10, 10, generator=g))

    def forward(self, grads):
        return sum((p * g).sum() for p, g in zip(self.parameters(), grads))


def gradients(rank, step, params):
    """Rank- and step-distinct gradients, with a few large entries so that selection matters."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    out = []
    for p in params:
        x = torch.randn(p.shape, generator=g)
        x.view(-1)[torch.randint(0, p.numel(), (3,), generator=g)] *= 20
        out.append(x)
    return out


def check(condition, message):
    if not condition:
        raise AssertionError(f"rank {dist.get_rank()}: {message}")


# Where the "device" case puts the models (--device), set by main().
DEVICE = torch.device("cpu")


def ddp(module, device=None):
    device = device or torch.device("cpu")
    if device.type == "cuda":
        return DDP(module.to(device), device_ids=[device.index])
    return DDP(module)


def hook_model(settings, lr=LR, device=None):
    model = ddp(FixedGradients(), device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0, weight_decay=0)
    state = dgc.torch.DGCState(model, optimizer, **settings)
    model.register_comm_hook(state, dgc.torch.dgc_hook)
    return model, optimizer, state


def train(model, optimizer, steps, bad_step=None):
    """`bad_step`: the step at which the last rank's gradient holds a NaN."""
    rank = dist.get_rank()
    params = list(model.module.parameters())
    for s in steps:
        optimizer.zero_grad()
        grads = gradients(rank, s, params)
        if s == bad_step and rank == dist.get_world_size() - 1:
            grads[0].view(-1)[5] = float("nan")
        model([g.to(p.device) for g, p in zip(grads, params)]).backward()
        optimizer.step()


def weights(model):
    return [p.detach().cpu().clone() for p in model.module.parameters()]


def max_difference(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))


DGC_SETTINGS = dict(
    iterations_per_epoch=4,  # warm-up: 1 epoch in 4 stages of one step (densities 0.25 ... 0.0039)
    density=0.01,
    warmup_epochs=1.0,
    warmup_stages=4,
    weight_decay=1e-3,
)


def equivalence():
    """The hook equals the C++ DistributedOptimizer for the same gradients (plain and Nesterov,
    and with one threshold over the whole model)."""
    rank = dist.get_rank()
    for nesterov, scope in ((False, "tensor"), (True, "tensor"), (False, "global")):
        settings = dict(DGC_SETTINGS, nesterov=nesterov, selection_scope=scope)
        model, optimizer, state = hook_model(settings)
        layout = ["compressed", "dense", "compressed", "dense"] if scope == "tensor" else ["dense"] * 4
        check([path for _, path in state.layout] == layout, f"{scope}: layout {state.layout}")
        start = weights(model)
        train(model, optimizer, range(STEPS))
        names = [n for n, _ in model.module.named_parameters()]
        grads = [gradients(rank, s, start) for s in range(STEPS)]
        reference = dgc._C._distributed_optimizer_steps(
            dist.group.WORLD, names, start, grads, state.options, LR
        )
        got = weights(model)
        moved = max_difference(got, start)
        difference = max_difference(got, reference)
        # The C++ update is w -= lr * d; SGD's add_(d, alpha=-lr) may fuse it (one rounding):
        # the two differ by at most a few ulp of w per step.
        check(moved > 1e-2, f"the weights did not move ({moved})")
        check(difference < 1e-5, f"nesterov={nesterov} {scope}: hook vs C++ optimizer differ by {difference}")
        check(state.iteration == STEPS, f"iteration {state.iteration}")
        check(0 < state.last_bytes["message"] < state.last_bytes["dense_gradient"] / 10, f"bytes {state.last_bytes}")
        print(f"rank {rank}: equivalence nesterov={nesterov} {scope}: max |hook - C++| = {difference:.3g}, moved {moved:.3g}")
    # exchange="auto" with a stated link: the cost model's choice (as dgc train --link), the same
    # on every rank, and the hook equal to the C++ optimizer with that exchange.
    model, optimizer, state = hook_model(dict(DGC_SETTINGS, exchange="auto", link="20:20"))
    world = dist.get_world_size()
    check(state.exchange_choice.startswith(f"exchange auto: ")
          and f" for {world} workers at 20 Mbit/s, 20 ms: predicted allgather " in state.exchange_choice,
          f"exchange choice '{state.exchange_choice}'")
    chosen = state.exchange_choice.split()[2]
    check(f"exchange={chosen}" in state.options.describe(), f"{chosen} not in {state.options.describe()}")
    start = weights(model)
    train(model, optimizer, range(STEPS))
    grads = [gradients(rank, s, start) for s in range(STEPS)]
    names = [n for n, _ in model.module.named_parameters()]
    reference = dgc._C._distributed_optimizer_steps(dist.group.WORLD, names, start, grads, state.options, LR)
    difference = max_difference(weights(model), reference)
    check(difference < 1e-5, f"exchange auto ({chosen}): hook vs C++ optimizer differ by {difference}")
    print(f"rank {rank}: {state.exchange_choice}")


def dense():
    """Density 1 without masking (the dense path exact, or grouped at density 1), and compression
    none, equal plain DDP with momentum SGD."""
    rank = dist.get_rank()
    for nesterov in (False, True):
        plain = DDP(FixedGradients())
        sgd = torch.optim.SGD(plain.parameters(), lr=LR, momentum=0.9, weight_decay=1e-3, nesterov=nesterov)
        start = weights(plain)
        train(plain, sgd, range(STEPS))
        expected = weights(plain)
        for settings in (
            dict(density=1.0, warmup_epochs=0, masking=False, dense_path="exact"),
            dict(density=1.0, warmup_epochs=0, masking=False, dense_path_density=1.0),
            dict(compression="none"),
        ):
            model, optimizer, _ = hook_model(
                dict(settings, iterations_per_epoch=1, nesterov=nesterov, weight_decay=1e-3, momentum=0.9)
            )
            train(model, optimizer, range(STEPS))
            difference = max_difference(weights(model), expected)
            moved = max_difference(expected, start)
            check(moved > 1e-2, f"plain DDP did not move ({moved})")
            check(difference < 1e-5, f"{settings} nesterov={nesterov}: hook vs plain DDP differ by {difference}")
            print(f"rank {rank}: {settings} nesterov={nesterov}: max |hook - DDP| = {difference:.3g}")


def buckets():
    """The hook's own buckets (bucket_cap_mb), each started as DDP hands its gradients over during
    the backward pass: weights, state and RNG bit for bit those of one message per step, and the
    C++ optimizer's within rounding; settings that need the whole gradient keep one message."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # DDP's first bucket (1 MiB) would hold this small model whole; with 4,000 bytes DDP hands it
    # over in two buckets from the second iteration on (the first hands one: DDP's own order).
    first_bucket = dist._DEFAULT_FIRST_BUCKET_BYTES
    dist._DEFAULT_FIRST_BUCKET_BYTES = 4000
    try:
        for extra in (dict(), dict(nesterov=True, masking=False), dict(compression="none")):
            settings = dict(DGC_SETTINGS, **extra)
            runs = {}
            for cap in (0.004, 0.0):  # 4,194 bytes: conv, weight, then the dense-path group
                model = DDP(FixedGradients(), bucket_cap_mb=0.004)
                optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0, weight_decay=0)
                state = dgc.torch.DGCState(model, optimizer, bucket_cap_mb=cap, **settings)
                model.register_comm_hook(state, dgc.torch.dgc_hook)
                start = weights(model)
                train(model, optimizer, range(STEPS))
                runs[cap] = (weights(model), state.state_dict(), state)
            (bucketed, bucketed_state, state), (single, single_state, one) = runs[0.004], runs[0.0]
            # Each bucket's tensors in the model's order; the buckets in backward order.
            expected = [["conv"], ["weight"], ["bias", "small"]] if "compression" not in extra else \
                [["conv", "small"], ["weight", "bias"]]
            check(state.buckets == expected, f"{extra}: buckets {state.buckets}, expected {expected}")
            check(state.bucket_count == len(expected) and one.bucket_count == 1,
                  f"{extra}: bucket counts {state.bucket_count}, {one.bucket_count}")
            check("wait" in state.last_timings, f"{extra}: no wait in {state.last_timings}")
            check(one.one_message_reason != "", "bucket_cap_mb=0 gave no reason for one message")
            moved = max_difference(bucketed, start)
            check(moved > 1e-2, f"{extra}: the weights did not move ({moved})")
            if extra.get("compression") == "none" and world > 2:
                # A ring allreduce sums an element in an order that depends on where it falls in
                # the buffer: bit for bit with 2 ranks, equal up to float32 rounding with more.
                difference = max_difference(bucketed, single)
                check(difference < 1e-6, f"{extra}: bucketed vs one message differ by {difference}")
            else:
                check(all(torch.equal(a, b) for a, b in zip(bucketed, single)),
                      f"{extra}: bucketed vs one message differ by {max_difference(bucketed, single)}")
                check(all(torch.equal(bucketed_state["buffers"][k], v) for k, v in single_state["buffers"].items())
                      and bucketed_state["rng"] == single_state["rng"],
                      f"{extra}: the bucketed state differs from one message's")
            names = [n for n, _ in model.module.named_parameters()]
            grads = [gradients(rank, s, start) for s in range(STEPS)]
            reference = dgc._C._distributed_optimizer_steps(dist.group.WORLD, names, start, grads, state.options, LR)
            difference = max_difference(bucketed, reference)
            check(difference < 1e-5, f"{extra}: bucketed hook vs C++ optimizer differ by {difference}")
            print(f"rank {rank}: buckets {extra}: {state.bucket_count} buckets equal one message, "
                  f"max |hook - C++| = {difference:.3g}")
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = first_bucket
    # Settings that need the whole gradient keep one message, and say why.
    for extra, text in ((dict(selection_scope="global"), "global"), (dict(clip_norm=1.0), "clip")):
        model, optimizer, state = hook_model(dict(DGC_SETTINGS, bucket_cap_mb=0.004, **extra))
        check(state.bucket_count == 1 and text in state.one_message_reason,
              f"{extra}: {state.bucket_count} buckets, reason '{state.one_message_reason}'")
        train(model, optimizer, range(2))
    expect_error(dgc.InvalidArgument, "bucket_cap_mb must be >= 0",
                 lambda: hook_model(dict(DGC_SETTINGS, bucket_cap_mb=-1)))
    print(f"rank {rank}: one message where the step needs the whole gradient")


def resume():
    """state_dict() / load_state_dict() in the middle of training resume bit for bit."""
    rank = dist.get_rank()
    model, optimizer, _ = hook_model(DGC_SETTINGS)
    train(model, optimizer, range(STEPS))
    uninterrupted = weights(model)

    model, optimizer, state = hook_model(DGC_SETTINGS)
    train(model, optimizer, range(STEPS // 2))
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "dgc": state.state_dict()}, saved)
    # Let the first run go on, so the resumed run cannot share its state by accident.
    train(model, optimizer, range(STEPS // 2, STEPS))

    saved.seek(0)
    checkpoint = torch.load(saved)
    model, optimizer, state = hook_model(DGC_SETTINGS)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    state.load_state_dict(checkpoint["dgc"])
    check(state.iteration == STEPS // 2, f"iteration after load {state.iteration}")
    train(model, optimizer, range(STEPS // 2, STEPS))
    resumed = weights(model)
    check(all(torch.equal(a, b) for a, b in zip(resumed, uninterrupted)),
          f"resumed run differs from the uninterrupted one by {max_difference(resumed, uninterrupted)}")

    # Without the DGC state the run is not the same (the test can fail).
    model, optimizer, state = hook_model(DGC_SETTINGS)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    state._step.iteration = STEPS // 2
    train(model, optimizer, range(STEPS // 2, STEPS))
    check(max_difference(weights(model), uninterrupted) > 0, "losing the DGC state changed nothing")

    # A state dict of other settings or another rank is refused.
    other, other_optimizer, other_state = hook_model(dict(DGC_SETTINGS, density=0.02))
    expect_error(dgc.DataError, "'density' is 0.01 in the state dict but 0.02 now",
                 lambda: other_state.load_state_dict(checkpoint["dgc"]))
    wrong_rank = dict(checkpoint["dgc"], rank=(rank + 1) % dist.get_world_size())
    expect_error(dgc.DataError, "belongs to rank", lambda: state.load_state_dict(wrong_rank))
    print(f"rank {rank}: resume bit for bit")


def expect_error(kind, text, fn):
    try:
        fn()
    except kind as error:
        check(text in str(error), f"{kind.__name__} without '{text}': {error}")
        check(isinstance(error, dgc.DGCError), f"{type(error).__name__} is not a dgc.DGCError")
        return
    raise AssertionError(f"rank {dist.get_rank()}: no {kind.__name__} ('{text}')")


def errors():
    """The errors a Python user meets, each saying what to do."""
    rank = dist.get_rank()
    net = FixedGradients()
    sgd = torch.optim.SGD(net.parameters(), lr=LR)
    expect_error(dgc.InvalidArgument, "DistributedDataParallel(model)",
                 lambda: dgc.torch.DGCState(net, sgd, iterations_per_epoch=1))
    model = DDP(FixedGradients())
    for kwargs, text in (
        (dict(momentum=0.9), "create SGD with momentum=0"),
        (dict(weight_decay=1e-4), "create SGD with weight_decay=0"),
        (dict(momentum=0.9, nesterov=True), "create SGD with momentum=0"),
    ):
        sgd = torch.optim.SGD(model.parameters(), lr=LR, **kwargs)
        expect_error(dgc.InvalidArgument, text,
                     lambda: dgc.torch.DGCState(model, sgd, iterations_per_epoch=1))
    adam = torch.optim.Adam(model.parameters())
    expect_error(dgc.InvalidArgument, "needs torch.optim.SGD",
                 lambda: dgc.torch.DGCState(model, adam, iterations_per_epoch=1))
    sgd = torch.optim.SGD(model.parameters(), lr=LR)
    expect_error(dgc.InvalidArgument, "iterations_per_epoch must be at least 1",
                 lambda: dgc.torch.DGCState(model, sgd, iterations_per_epoch=0))
    # Settings that differ across ranks: every rank learns it, with the first difference named.
    expect_error(dgc.MismatchError, "density",
                 lambda: dgc.torch.DGCState(model, sgd, iterations_per_epoch=1,
                                            density=0.001 if rank == 0 else 0.01))
    # A link chooses the exchange only with exchange="auto"; an unknown link names the forms.
    expect_error(dgc.InvalidArgument, "pass exchange='auto'",
                 lambda: dgc.torch.DGCState(model, sgd, iterations_per_epoch=1, link="ethernet-1g"))
    expect_error(dgc.InvalidArgument, "RATE_MBIT[:LATENCY_MS]",
                 lambda: dgc.torch.DGCState(model, sgd, iterations_per_epoch=1, exchange="auto", link="fast"))
    # Momentum set in SGD after the hook was created: the next step refuses.
    model, optimizer, state = hook_model(DGC_SETTINGS)
    optimizer.param_groups[0]["momentum"] = 0.9
    try:
        train(model, optimizer, range(1))
    except Exception as error:  # DDP re-raises the hook's error from backward()
        check("momentum=0" in str(error), f"momentum set later: {error}")
    else:
        raise AssertionError("momentum set after DGCState was not refused")
    print(f"rank {rank}: errors ok")


def nonfinite():
    """A NaN gradient on the last rank: on_nonfinite="skip" applies nothing on any rank and the
    next step equals that of the run that never saw the bad step (its counter moved past it);
    "stop" (the default) raises dgc.NumericError on every rank; the setting must agree."""
    rank, world = dist.get_rank(), dist.get_world_size()
    skip = dict(DGC_SETTINGS, on_nonfinite="skip", max_consecutive_skips=3)

    # The run that never saw the bad step 2.
    model, optimizer, state = hook_model(skip)
    train(model, optimizer, range(2))
    state._step.iteration = 3
    train(model, optimizer, [3])
    reference = weights(model)
    reference_state = state.state_dict()

    model, optimizer, state = hook_model(skip)
    train(model, optimizer, range(2))
    before, state_before = weights(model), state.state_dict()
    optimizer.zero_grad()
    grads = gradients(rank, 2, model.module.parameters())
    if rank == world - 1:
        grads[0].view(-1)[5] = float("nan")
    model(grads).backward()
    optimizer.step()
    check(all(torch.equal(a, b) for a, b in zip(weights(model), before)), "the skipped step moved the weights")
    after = state.state_dict()
    check(all(torch.equal(after["buffers"][k], v) for k, v in state_before["buffers"].items()),
          "the skipped step changed the hook's state")
    check(after["rng"] == state_before["rng"], "the skipped step drew from the RNG")
    check(state.skipped_steps == 1 and state.iteration == 3,
          f"skipped_steps {state.skipped_steps}, iteration {state.iteration}")
    train(model, optimizer, [3])
    check(all(torch.equal(a, b) for a, b in zip(weights(model), reference)),
          f"the step after the skip differs from the run without it by {max_difference(weights(model), reference)}")
    final = state.state_dict()
    check(all(torch.equal(final["buffers"][k], v) for k, v in reference_state["buffers"].items()),
          "the state after the skip differs from the run without it")
    check(final["skipped_steps"] == 1, "the state dict does not carry skipped_steps")

    # The setting must agree across ranks, and be one of the two.
    expect_error(dgc.MismatchError, "on_nonfinite",
                 lambda: hook_model(dict(DGC_SETTINGS, on_nonfinite="skip" if rank == 0 else "stop")))
    expect_error(dgc.InvalidArgument, "expected stop or skip",
                 lambda: hook_model(dict(DGC_SETTINGS, on_nonfinite="ignore")))

    # The default stops every rank with nothing applied.
    model, optimizer, state = hook_model(DGC_SETTINGS)
    train(model, optimizer, range(2))
    before = weights(model)
    optimizer.zero_grad()
    grads = gradients(rank, 2, model.module.parameters())
    if rank == world - 1:
        grads[0].view(-1)[5] = float("inf")
    try:
        model(grads).backward()
    except Exception as error:  # DDP re-raises the hook's error from backward()
        check(f"non-finite gradient (NaN or Inf) on 1 of {world} rank(s)" in str(error), f"stop: {error}")
    else:
        raise AssertionError(f"rank {rank}: on_nonfinite='stop' did not raise")
    check(all(torch.equal(a, b) for a, b in zip(weights(model), before)), "the stopped step moved the weights")
    print(f"rank {rank}: non-finite gradient skipped and stopped")


class FakeParameter:
    """Stands for a parameter on `device` (the compressor choice reads only .device)."""

    def __init__(self, device):
        self.device = torch.device(device)


def device():
    """The device compressor (compressor="device", libtorch operations on the gradients' device)
    gives the weights, the state and the bytes of the core (compressor="core", which copies the
    gradients to the host) for the same model on the same device: bit for bit on CPU tensors, for every setting it supports; a state dict of one resumes on the
    other; a skipped non-finite step is skipped alike."""
    rank = dist.get_rank()
    cases = (
        dict(DGC_SETTINGS),
        dict(DGC_SETTINGS, nesterov=True),
        dict(DGC_SETTINGS, selection="exact"),
        dict(DGC_SETTINGS, dense_path="exact", nesterov=True),
        dict(DGC_SETTINGS, value_type="fp16"),
        dict(DGC_SETTINGS, value_type="bf16", masking=False),
        dict(DGC_SETTINGS, exchange="direct", weight_decay=0.0),
        dict(DGC_SETTINGS, clip_norm=2.0),
        dict(DGC_SETTINGS, on_nonfinite="skip"),
    )
    exact = DEVICE.type == "cpu"
    for settings in cases:
        bad_step = 2 if settings.get("on_nonfinite") == "skip" else None
        # One message, as the device compressor sends (the core's buckets equal it: buckets()).
        core, core_sgd, core_state = hook_model(dict(settings, compressor="core", bucket_cap_mb=0),
                                                device=DEVICE)
        train(core, core_sgd, range(STEPS), bad_step)
        mine, mine_sgd, mine_state = hook_model(dict(settings, compressor="device"), device=DEVICE)
        check(mine_state.compressor == "device", f"compressor {mine_state.compressor}")
        check(next(mine.module.parameters()).device.type == DEVICE.type, "the model left its device")
        train(mine, mine_sgd, range(STEPS), bad_step)
        difference = max_difference(weights(mine), weights(core))
        a, b = mine_state.state_dict(), core_state.state_dict()
        state_difference = max((a["buffers"][k] - v).abs().max().item() for k, v in b["buffers"].items())
        check(set(a["buffers"]) == set(b["buffers"]), f"state buffers {sorted(a['buffers'])} vs {sorted(b['buffers'])}")
        # Clipping sums the squares in another order on the device: the coefficient may differ
        # in the last bit.
        tolerance = 0.0 if exact and not settings.get("clip_norm") else 1e-5
        check(difference <= tolerance, f"{settings}: device vs core weights differ by {difference}")
        check(state_difference <= tolerance, f"{settings}: device vs core state differs by {state_difference}")
        if tolerance == 0.0:
            check(a["rng"] == b["rng"], f"{settings}: the RNGs differ")
            check(a["total_bytes"] == b["total_bytes"], f"{settings}: bytes {a['total_bytes']} vs {b['total_bytes']}")
        check(a["skipped_steps"] == (1 if bad_step is not None else 0), f"skipped {a['skipped_steps']}")
        print(f"rank {rank}: device ({DEVICE}) vs core {settings}: max |difference| = {difference:.3g}")

    # A state dict written by the core resumes on the device, and the other way round.
    for first, second in (("core", "device"), ("device", "core")):
        uninterrupted, sgd, _ = hook_model(dict(DGC_SETTINGS, compressor="core"), device=DEVICE)
        train(uninterrupted, sgd, range(STEPS))
        model, sgd, state = hook_model(dict(DGC_SETTINGS, compressor=first), device=DEVICE)
        train(model, sgd, range(STEPS // 2))
        saved = {"model": {k: v.cpu() for k, v in model.state_dict().items()}, "dgc": state.state_dict()}
        resumed, sgd, state = hook_model(dict(DGC_SETTINGS, compressor=second), device=DEVICE)
        resumed.load_state_dict(saved["model"])
        state.load_state_dict(saved["dgc"])
        train(resumed, sgd, range(STEPS // 2, STEPS))
        difference = max_difference(weights(resumed), weights(uninterrupted))
        check(difference <= (0.0 if exact else 1e-5), f"{first} -> {second}: resumed run differs by {difference}")
        print(f"rank {rank}: resumed {first} -> {second}: max |difference| = {difference:.3g}")

    # compressor="auto": the device compressor for parameters on a GPU when the settings allow.
    choose = dgc.torch._choose_compressor
    on = lambda device: [("w", FakeParameter(device))]
    check(choose("auto", on("cpu"), {}) == "core", "auto on the CPU")
    check(choose("auto", on("cuda"), dict(exchange="allgather")) == "device", "auto on a GPU")
    check(choose("auto", on("cuda"), dict(dense_path="fp16")) == "core", "auto, fp16 dense path")
    check(choose("auto", on("cuda"), dict(exchange="auto")) == "core", "auto, exchange auto")
    check(choose("device", on("cpu"), {}) == "device", "device on the CPU")

    # Settings the device compressor does not have are refused with the remedy.
    expect_error(dgc.InvalidArgument, "compressor=\"core\"",
                 lambda: hook_model(dict(DGC_SETTINGS, compressor="device", exchange="sparse-allreduce"),
                                    device=DEVICE))
    print(f"rank {rank}: device compressor ok")


def not_initialised():
    net = FixedGradients()
    sgd = torch.optim.SGD(net.parameters(), lr=LR)
    try:
        dgc.torch.DGCState(net, sgd, iterations_per_epoch=1)
    except dgc.InvalidArgument as error:
        if "init_process_group" not in str(error):
            raise AssertionError(f"no remedy in: {error}")
    else:
        raise AssertionError("DGCState without an initialised process group was accepted")


def main():
    global DEVICE
    parser = argparse.ArgumentParser()
    parser.add_argument("case")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    args = parser.parse_args()
    case = args.case
    torch.set_num_threads(1)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("hook_worker.py --device cuda: torch.cuda.is_available() is False")
        DEVICE = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(DEVICE)
    if case == "errors":
        not_initialised()
    dist.init_process_group(args.backend, timeout=__import__("datetime").timedelta(seconds=60))
    launch = "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "spawned"
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}: launched by {launch}")
    try:
        {"equivalence": equivalence, "dense": dense, "buckets": buckets, "resume": resume, "errors": errors,
         "nonfinite": nonfinite, "device": device}[case]()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
