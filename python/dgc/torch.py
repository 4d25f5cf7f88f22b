"""A DDP communication hook that runs Deep Gradient Compression in dgc's C++ core.

    state = dgc.torch.DGCState(ddp_model, sgd, iterations_per_epoch=len(loader))
    ddp_model.register_comm_hook(state, dgc.torch.dgc_hook)

What runs where. DDP calls the hook once per gradient bucket, during the backward pass. The hook
runs the dgc step of the C++ front end's DistributedOptimizer (docs/training.md) in buckets of
its own (``bucket_cap_mb``, by default DDP's: the tensors in reverse order, as DDP assigns them):
each bucket's momentum correction, selection, encoding and exchange start on a communication
thread as soon as DDP has handed over all its gradients, while the backward pass goes on, and the
last bucket DDP hands over waits for whatever is still in flight. Per-tensor selection makes this
the same mathematics as one step over the whole model, bit for bit. Where a bucket cannot start
before the whole gradient is known (``selection_scope="global"``, clipping, ``on_nonfinite="skip"``,
a 16-bit dense path, ``exchange="sparse-allreduce"``, the device compressor, ``bucket_cap_mb=0``)
the hook holds every bucket until the last one and runs one step over the whole model
(``DGCState.one_message_reason`` says why). The step: local clipping over all gradients,
momentum correction, sampled threshold selection and momentum factor masking per compressed tensor
(more than one dimension and at least `min_compress_numel` elements), one fused message per worker
over the process group, dense-path tensors (biases, small tensors) averaged with ordinary momentum,
weight decay applied locally. It writes the resulting direction into the buckets: the user's
``torch.optim.SGD`` then takes ``w -= lr * direction``. The learning rate (and its schedule) is the
optimizer's; the density warm-up is the hook's.

What the user must set: ``torch.optim.SGD`` with ``momentum=0`` and ``weight_decay=0`` (and
``nesterov=False``): momentum and weight decay live in the hook (pass them to DGCState instead).
DGCState checks this and checks it again at every step.

Collective: DGCState() (a handshake that compares every setting across ranks), and every
backward pass, on every rank of the process group.
"""

import logging

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dgc import DataError, InvalidArgument, _C

__all__ = ["DGCState", "dgc_hook"]

_log = logging.getLogger("dgc")

_STATE_VERSION = 1


def _first_difference(stored, current):
    """The first 'key=value' line of two settings texts that differs, for messages."""
    a = dict(line.split("=", 1) for line in stored.splitlines() if "=" in line)
    b = dict(line.split("=", 1) for line in current.splitlines() if "=" in line)
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            return f"setting '{key}' is {a.get(key, '(missing)')} in the state dict but {b.get(key, '(missing)')} now"
    return "the settings differ"


def _check_optimizer(optimizer, params, momentum, weight_decay):
    if not isinstance(optimizer, torch.optim.SGD):
        raise InvalidArgument(
            f"DGC needs torch.optim.SGD, got {type(optimizer).__name__}: momentum and weight decay "
            f"run in the hook, so the optimizer must only apply w -= lr * grad. Use "
            f"torch.optim.SGD(model.parameters(), lr=..., momentum=0, weight_decay=0)"
        )
    covered = set()
    for index, group in enumerate(optimizer.param_groups):
        if group.get("momentum", 0) != 0:
            raise InvalidArgument(
                f"SGD param group {index} has momentum={group['momentum']}, but with DGC the "
                f"momentum lives in the hook (momentum correction): create SGD with momentum=0 "
                f"and pass momentum={group['momentum']} to DGCState (it has momentum={momentum})"
            )
        if group.get("weight_decay", 0) != 0:
            raise InvalidArgument(
                f"SGD param group {index} has weight_decay={group['weight_decay']}, but with DGC "
                f"weight decay is applied in the hook (locally, it need not travel): create SGD "
                f"with weight_decay=0 and pass weight_decay={group['weight_decay']} to DGCState "
                f"(it has weight_decay={weight_decay})"
            )
        if group.get("nesterov", False):
            raise InvalidArgument(
                f"SGD param group {index} has nesterov=True: create SGD with nesterov=False and "
                f"pass nesterov=True to DGCState"
            )
        if group.get("maximize", False):
            raise InvalidArgument(f"SGD param group {index} has maximize=True, which DGC does not support")
        covered.update(id(p) for p in group["params"])
    missing = [name for name, p in params if id(p) not in covered]
    if missing:
        raise InvalidArgument(
            f"the optimizer does not update {len(missing)} parameter(s) of the model (first: "
            f"'{missing[0]}'): give SGD model.parameters()"
        )


# Settings the device compressor does not have (python/device_step.h), and what they are set to.
_CORE_ONLY = {
    "compression": ("none",),
    "selection_scope": ("global",),
    "dense_path": ("fp16", "bf16"),
    "exchange": ("sparse-allreduce", "auto"),  # auto may resolve to the sparse allreduce
}


def _choose_compressor(compressor, params, settings):
    """ "core" (the C++ core on the host), "device" (libtorch operations on the parameters'
    device), or "auto": "device" when the parameters are on one device that is not the CPU and
    the settings are the device compressor's, "core" otherwise."""
    devices = {p.device for _, p in params}
    if compressor not in ("auto", "core", "device"):
        raise InvalidArgument(f"compressor must be 'auto', 'core' or 'device', got {compressor!r}")
    if compressor == "core":
        return "core"
    if compressor == "device":
        if len(devices) != 1:
            raise InvalidArgument(
                f"the model's parameters are on {len(devices)} devices ({sorted(map(str, devices))}): "
                f"the device compressor needs one (DDP with one device per process), or pass "
                f"compressor='core'"
            )
        return "device"
    if len(devices) != 1 or next(iter(devices)).type == "cpu":
        return "core"
    unsupported = [key for key, values in _CORE_ONLY.items() if settings.get(key) in values]
    if unsupported:
        _log.info("dgc: %s=%r keeps the compressor on the host (compressor='core')",
                  unsupported[0], settings[unsupported[0]])
        return "core"
    return "device"


class DGCState:
    """The state of the DGC hook on this rank: settings, momenta, velocities, the RNG, the iteration.

    model: the DistributedDataParallel model the hook is registered on.
    optimizer: its torch.optim.SGD, created with momentum=0, weight_decay=0.
    process_group: the group to exchange over (default: the model's, i.e. the default group).
    iterations_per_epoch: optimizer steps per epoch (len(train_loader)); the density warm-up is
        counted in epochs.
    compression: "dgc", or "none" for the dense baseline (allreduce, ordinary momentum) through
        the same hook.
    density, warmup_epochs, warmup_stages: density d after warm-up, and the exponential warm-up
        (density max(d, 0.25^(s+1)) in stage s; warmup_stages stages fitted into warmup_epochs,
        0 = one stage per epoch), as `dgc train`'s flags of the same names.
    momentum, nesterov, masking, weight_decay, clip_norm: the paper's momentum correction,
        momentum factor masking, local weight decay and local clipping (each worker's gradient
        before accumulation; clip_scaling "paper" or "mean" as `dgc train --clip-scaling`).
    selection, sample_ratio, value_type, min_compress_numel, compress_1d, exchange,
        dense_path ("grouped", "exact", "fp16", "bf16"), dense_path_density, seed, timeout: as
        the `dgc train` flags (docs/training.md).
    selection_scope: "tensor" (each tensor its own threshold, the paper's) or "global" (one
        threshold over every parameter at once, the dense path included; needs dense_path
        "grouped"), as `dgc train --selection-scope`.
    link: with ``exchange="auto"``, the network between the ranks, as ``dgc train --link``: a
        platform of bench/platforms (``"ethernet-1g"``, ``"mobile"``, ...) or
        ``"RATE_MBIT[:LATENCY_MS]"``; auto then takes the exchange that ``dgc plan``'s cost model
        predicts fastest for this model, world size and density, and ``exchange_choice`` holds
        the line that says so (also logged at INFO on the "dgc" logger). Without a link, auto
        chooses by the size rule of the exchange.
    bucket_cap_mb: the size of the hook's own buckets in MB (2^20 bytes of float32); None (the
        default) takes the DDP model's ``bucket_cap_mb``; 0 holds every bucket until the last and
        sends one message per step. ``bucket_count``, ``buckets`` and ``one_message_reason`` say
        what was planned. last_bucket_cap_mb: the last bucket of tensors (the first layers, whose
        gradients come last, so that none of its work overlaps the backward pass) cut to about
        this many MB (0: as the cap gives it), as ``dgc train --last-bucket-cap-mb``.

    on_nonfinite: when any rank's gradient holds NaN or Inf: "stop" (every rank raises
        dgc.NumericError, nothing applied) or "skip" (every rank skips the step: the hook hands
        back zero gradients, so SGD leaves the weights as they are; the hook's state stays as
        before the step; the iteration advances; `skipped_steps` counts it and one warning is
        logged on the "dgc" logger). max_consecutive_skips: with "skip", the most steps skipped
        in a row; one more bad step raises dgc.NumericError.

    compressor: where the step runs. "core": dgc's C++ core on the host (gradients on a GPU are
        copied to the host and the directions back, every step; every setting is available).
        "device": the same step written with libtorch operations on the gradients' own device,
        so that only the selected elements (and the small dense-path tensors) reach the host;
        not with compression="none", selection_scope="global", dense_path "fp16"/"bf16" or
        exchange="sparse-allreduce" (or "auto", which may resolve to it). "auto" (the default):
        "device" when the parameters are on a GPU and the settings allow it, "core" otherwise.
        On CPU tensors both give the same weights.

    Every rank must pass the same settings: the constructor compares them across ranks and raises
    dgc.MismatchError on every rank naming the first difference.
    """

    def __init__(
        self,
        model,
        optimizer,
        *,
        iterations_per_epoch,
        process_group=None,
        compression="dgc",
        density=0.001,
        warmup_epochs=1.0,
        warmup_stages=4,
        momentum=0.9,
        nesterov=False,
        masking=True,
        weight_decay=1e-4,
        clip_norm=0.0,
        selection="sampled",
        sample_ratio=0.01,
        value_type="fp32",
        min_compress_numel=1024,
        compress_1d=False,
        exchange="allgather",
        seed=0,
        timeout=60.0,
        dense_path="grouped",
        dense_path_density=0.1,
        selection_scope="tensor",
        clip_scaling="paper",
        on_nonfinite="stop",
        max_consecutive_skips=10,
        compressor="auto",
        bucket_cap_mb=None,
        last_bucket_cap_mb=1.0,
        link=None,
    ):
        if not dist.is_available() or not dist.is_initialized():
            raise InvalidArgument(
                "torch.distributed is not initialised: call "
                "torch.distributed.init_process_group('gloo') (under torchrun it reads RANK, "
                "WORLD_SIZE, MASTER_ADDR and MASTER_PORT) before creating the DDP model"
            )
        if not isinstance(model, DistributedDataParallel):
            raise InvalidArgument(
                f"DGCState needs the DistributedDataParallel model the hook is registered on, got "
                f"{type(model).__name__}: wrap it first, "
                f"model = torch.nn.parallel.DistributedDataParallel(model)"
            )
        group = process_group if process_group is not None else model.process_group
        backend = dist.get_backend(group)
        self.params = [(n, p) for n, p in model.module.named_parameters() if p.requires_grad]
        self.optimizer = optimizer
        self._momentum = momentum
        self._weight_decay = weight_decay
        _check_optimizer(optimizer, self.params, momentum, weight_decay)
        names = [n for n, _ in self.params]
        shapes = [list(p.shape) for _, p in self.params]
        self.exchange_choice = ""
        if link is not None:
            if exchange != "auto":
                raise InvalidArgument(
                    f"link={link!r} chooses the exchange only with exchange='auto' (got "
                    f"exchange={exchange!r}): pass exchange='auto', or leave link out"
                )
            if compression == "dgc":
                exchange, self.exchange_choice = _C._choose_exchange(
                    names, shapes, dist.get_world_size(group), density, link
                )
                _log.info("dgc: %s", self.exchange_choice)
        # Chosen before the options: the device compressor runs one message.
        self.compressor = _choose_compressor(
            compressor,
            self.params,
            dict(compression=compression, selection_scope=selection_scope, dense_path=dense_path,
                 exchange=exchange),
        )
        if bucket_cap_mb is None:
            bucket_cap_mb = getattr(model, "bucket_bytes_cap", 25 * 2**20) / 2**20
        if bucket_cap_mb < 0:
            raise InvalidArgument(f"bucket_cap_mb must be >= 0 (0: one message), got {bucket_cap_mb}")
        self.options = _C.Options(
            compression=compression,
            density=density,
            warmup_epochs=warmup_epochs,
            warmup_stages=warmup_stages,
            iterations_per_epoch=iterations_per_epoch,
            momentum=momentum,
            nesterov=nesterov,
            masking=masking,
            weight_decay=weight_decay,
            clip_norm=clip_norm,
            selection=selection,
            sample_ratio=sample_ratio,
            value_type=value_type,
            min_compress_numel=min_compress_numel,
            compress_1d=compress_1d,
            exchange=exchange,
            seed=seed,
            timeout=timeout,
            dense_path=dense_path,
            dense_path_density=dense_path_density,
            selection_scope=selection_scope,
            clip_scaling=clip_scaling,
            on_nonfinite=on_nonfinite,
            max_consecutive_skips=max_consecutive_skips,
            bucket_cap_mb=bucket_cap_mb if self.compressor == "core" else 0.0,
            last_bucket_cap_mb=last_bucket_cap_mb,
        )
        # NCCL takes CUDA tensors only: the exchange's buffers then live on this rank's GPU.
        exchange_device = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
        if self.compressor == "device":
            # The gradients, momenta and velocities stay on the parameters' device; only the
            # selections (and the dense-path values) come to the host (dgc/python/device_step.h).
            self._step = _C.DeviceStep(
                group, names, shapes, self.options, "hook=ddp\n", exchange_device,
                str(self.params[0][1].device),
            )
        else:
            self._step = _C.Step(group, names, shapes, self.options, "hook=ddp\n", exchange_device)
        self._index = {id(p): i for i, (_, p) in enumerate(self.params)}
        self._pending = []  # (buffer, gradients, parameters, future) of this iteration's buckets
        self._bucketed = self.compressor == "core" and self._step.bucket_count > 1
        if self._bucketed:
            _log.info("dgc: %d buckets of at most %g MB, each started as DDP hands it over",
                      self._step.bucket_count, bucket_cap_mb)
        elif self.one_message_reason:
            _log.info("dgc: one message per step: %s", self.one_message_reason)

    # How the step is cut (see the module comment).
    @property
    def bucket_count(self):
        """The hook's buckets, each exchanged as soon as its gradients are ready (1: one message)."""
        return self._step.bucket_count if self.compressor == "core" else 1

    @property
    def buckets(self):
        """Each bucket's parameter names, in the order the buckets are exchanged."""
        if self.compressor != "core":
            return [[n for n, _ in self.params]]
        return [[self.params[i][0] for i in bucket] for bucket in self._step.buckets]

    @property
    def one_message_reason(self):
        """Why the step travels in one message ("" when it is cut into buckets, or when one bucket
        holds the whole model anyway)."""
        if self.compressor != "core":
            return "the device compressor runs one step over the whole model"
        return self._step.one_message_reason

    # What the next / last step does and sent.
    @property
    def iteration(self):
        return self._step.iteration

    @property
    def skipped_steps(self):
        """Steps every rank skipped for a non-finite gradient (on_nonfinite="skip")."""
        return self._step.skipped_steps

    @property
    def density(self):
        """Density the next step uses."""
        return self._step.density

    @property
    def layout(self):
        """(name, "compressed" | "dense") of every parameter, in order."""
        return self._step.layout

    @property
    def last_bytes(self):
        """Bytes of the last step: message (this worker's), dense_gradient, wire_sent, ..."""
        return self._step.last_bytes

    @property
    def total_bytes(self):
        return self._step.total_bytes

    @property
    def last_timings(self):
        """Seconds of the last step's parts (summed over the buckets, which run beside the
        backward pass) and, with buckets, "wait": what the last bucket waited for them."""
        timings = dict(self._step.last_timings)
        if self._bucketed:
            timings["wait"] = self._step.last_wait_seconds
        return timings

    def state_dict(self):
        """This rank's state: u, v, the dense and weight-decay momenta, the RNG, the iteration.

        Per rank (the velocities differ between ranks); save it with the model's and the
        optimizer's state dicts, one file per rank.
        """
        return {
            "version": _STATE_VERSION,
            "settings": self._step.settings,
            "world_size": self._step.world_size,
            "rank": self._step.rank,
            "iteration": self._step.iteration,
            "rng": self._step.rng_state,
            "total_bytes": self._step.total_bytes,
            "post_warmup_bytes": self._step.post_warmup_bytes,
            "skipped_steps": self._step.skipped_steps,
            "consecutive_skips": self._step.consecutive_skips,
            "buffers": self._step.state_buffers(),
        }

    def load_state_dict(self, state):
        """Restores what state_dict() returned; raises dgc.DataError when it does not fit."""
        if state.get("version") != _STATE_VERSION:
            raise DataError(f"DGC state dict version {state.get('version')} is not {_STATE_VERSION}")
        if state["world_size"] != self._step.world_size:
            raise DataError(
                f"the DGC state dict was written by a run with {state['world_size']} workers, this "
                f"run has {self._step.world_size}: resume with the same number of workers"
            )
        if state["rank"] != self._step.rank:
            raise DataError(
                f"the DGC state dict belongs to rank {state['rank']}, not to rank {self._step.rank}: "
                f"load each rank's own file"
            )
        if state["settings"] != self._step.settings:
            raise DataError(
                "the DGC state dict was written with other settings: "
                + _first_difference(state["settings"], self._step.settings)
                + ". Resume with the same settings, or start a new run"
            )
        ours = set(self._step.state_buffers())
        missing = ours - set(state["buffers"])
        if missing:
            raise DataError(f"the DGC state dict lacks buffer '{sorted(missing)[0]}': it was written for another model")
        for name, values in state["buffers"].items():
            self._step.load_state_buffer(name, values)
        self._step.rng_state = state["rng"]
        self._step.iteration = state["iteration"]
        self._step.set_bytes(state["total_bytes"], state["post_warmup_bytes"])
        self._step.set_skipped_steps(state.get("skipped_steps", 0), state.get("consecutive_skips", 0))

    def _index_of(self, parameter):
        index = self._index.get(id(parameter))
        if index is None:
            raise InvalidArgument(
                "DDP handed the hook a parameter DGCState does not know: create "
                "DGCState from the DDP model the hook is registered on"
            )
        return index

    @staticmethod
    def _fail(pending, error):
        for _, _, _, future in pending:
            future.set_exception(error)

    def _add(self, bucket):
        future = torch.futures.Future()
        if not self._bucketed:
            self._pending.append((bucket.buffer(), bucket.gradients(), bucket.parameters(), future))
            return future
        # Our buckets whose gradients are now all given start on the communication thread.
        first = not self._pending
        self._pending.append((bucket.buffer(), None, None, future))
        try:
            if first:
                _check_optimizer(self.optimizer, self.params, self._momentum, self._weight_decay)
            parameters = bucket.parameters()
            indices = [self._index_of(p) for p in parameters]
            self._step.gradients_ready(indices, bucket.gradients(), parameters)
        except BaseException as error:
            # Buckets already started cannot be taken back: this state can take no further step.
            self._step.abandon()
            pending, self._pending = self._pending, []
            self._fail(pending, error)
            raise
        return future

    def _finish(self):
        """The bucketed step: waits for every bucket still in flight."""
        pending, self._pending = self._pending, []
        try:
            taken = self._step.finish()
        except BaseException as error:
            self._fail(pending, error)
            raise
        self._report(taken)
        for buffer, _, _, future in pending:
            future.set_result(buffer)

    def _report(self, taken):
        if not taken:
            _log.warning(
                "dgc: skipped iteration %d: non-finite gradient on %d of %d rank(s), nothing "
                "applied (%d skipped so far)",
                self._step.iteration - 1,
                self._step.last_bad_ranks,
                self._step.world_size,
                self._step.skipped_steps,
            )

    def _run(self):
        if self._bucketed:
            self._finish()
            return
        pending, self._pending = self._pending, []
        try:
            _check_optimizer(self.optimizer, self.params, self._momentum, self._weight_decay)
            grads = [None] * len(self.params)
            for _, gradients, parameters, _ in pending:
                for g, p in zip(gradients, parameters):
                    grads[self._index_of(p)] = g
            absent = [self.params[i][0] for i, g in enumerate(grads) if g is None]
            if absent:
                raise InvalidArgument(f"no gradient bucket held parameter '{absent[0]}'")
            taken = self._step.run(grads, [p for _, p in self.params])
        except BaseException as error:
            self._fail(pending, error)
            raise
        self._report(taken)
        for buffer, _, _, future in pending:
            future.set_result(buffer)


def dgc_hook(state, bucket):
    """The DDP communication hook: register with model.register_comm_hook(state, dgc_hook).

    Hands each bucket's gradients to the step as they arrive (the hook's buckets start as soon as
    their gradients are all there), or holds them for one message; at the iteration's last bucket
    waits for the step and completes every bucket's future with its direction (see the module
    comment).
    """
    future = state._add(bucket)
    if bucket.is_last():
        state._run()
    return future
