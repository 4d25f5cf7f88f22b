"""Fashion-MNIST with DistributedDataParallel and a choice of gradient communication hook.

The CNN and schedule of `dgc train` (docs/training.md) in plain PyTorch, launched with torchrun:

    PYTHONPATH=build/python /usr/bin/python3 scripts/torchrun.py --nproc_per_node 4 \
        examples/train_fmnist.py --hook dgc

--hook none       DDP's own allreduce (dense fp32), SGD with momentum and weight decay
--hook fp16       PyTorch's fp16_compress_hook
--hook powersgd   PyTorch's powerSGD_hook (--powersgd-rank, warm start and error feedback on,
                  plain allreduce for the first --warmup-epochs, as its documentation recommends
                  when training has a warm-up), one bucket at a time (see one_bucket_at_a_time)
--hook dgc        dgc.torch.dgc_hook: Deep Gradient Compression in dgc's C++ core at --density
                  after an exponential warm-up over --warmup-epochs; SGD gets momentum=0 and
                  weight_decay=0 because both run in the hook

Every rank reads the data set (Debian's dataset-fashion-mnist), takes its slice of each global
batch in an order that depends only on (seed, epoch), and the learning rate ramps up linearly over
--warmup-epochs and then follows a cosine to 0. Rank 0 prints one line per epoch, then the result as one JSON
object (also appended to the file --json names): test accuracy, bytes this worker contributed per step (the
message bytes of docs/glossary: what the hook hands to the process group; for DDP's own allreduce
the fp32 gradient), the compression ratio (fp32 gradient bytes / message bytes) and the time per
step (forward, backward, communication, optimizer; mean over the steps after the first 10),
and a SHA-256 of the final weights.

Restarts (torchrun --max_restarts N): with --checkpoint PREFIX every rank writes
PREFIX.step<S>.rank<r>.pt (its model, optimizer and DGCState state dicts, the position in the
run) at every epoch's end and every --checkpoint-every steps, atomically, keeping its newest two.
At start-up the ranks look for the newest step every rank has a file of and continue from there,
bit for bit (the same command line for the first attempt and every restart); with none they
start fresh. The world size must be the one the files were written at (DGCState refuses
another).
"""

import argparse
import glob
import gzip
import hashlib
import json
import math
import os
import struct
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530


class CNN(torch.nn.Module):
    """conv 3x3 1->32, pool, conv 3x3 32->32, pool, fc 1568->256, fc 256->10 (413,802 parameters)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.fc1 = torch.nn.Linear(32 * 7 * 7, 256)
        self.fc2 = torch.nn.Linear(256, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(f">{dims}I", data[4 : 4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims :]), dtype=torch.uint8).reshape(shape)


def load(directory, split, limit):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte.gz"))
    if limit:
        images, labels = images[:limit], labels[:limit]
    images = (images.float() / 255.0 - PIXEL_MEAN) / PIXEL_STD
    return images.unsqueeze(1), labels.long()


def learning_rate(args, iteration, per_epoch):
    """lr_at of dgc/core/schedule.h: linear ramp ((it + 1) / W), then cosine to 0."""
    warmup = args.warmup_epochs * per_epoch
    lr = args.lr
    if args.epochs > args.warmup_epochs:
        progress = (iteration - warmup) / ((args.epochs - args.warmup_epochs) * per_epoch)
        lr *= 0.5 * (1.0 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
    if iteration < warmup:
        lr *= (iteration + 1) / warmup
    return lr


class ByteCounter:
    """Counts the bytes every dist.all_reduce of this process is given while `on` (the hooks of
    PyTorch call dist.all_reduce, also from their continuations)."""

    def __init__(self):
        self.on = False
        self.bytes = 0
        real = dist.all_reduce

        def counted(tensor, *args, **kwargs):
            if self.on:
                self.bytes += tensor.numel() * tensor.element_size()
            return real(tensor, *args, **kwargs)

        dist.all_reduce = counted


def one_bucket_at_a_time(hook):
    """Runs `hook` on a bucket only after the previous bucket's future has completed.

    PyTorch's powerSGD_hook issues its later collectives (Ps, Qs) from future callbacks, on the
    process group's threads, while DDP calls the hook for the next bucket on the autograd thread:
    with Gloo and more than one bucket the ranks can then issue collectives in different orders,
    and Gloo aborts ("op.preamble.length <= op.nbytes", seen on this model with 2 buckets).
    Waiting for the previous bucket makes the order the same on every rank; it costs PowerSGD
    the overlap of one bucket's communication with the next bucket's.
    """
    previous = []

    def hook_in_order(state, bucket):
        if previous and bucket.index() > 0:
            previous.pop().wait()
        previous.clear()
        future = hook(state, bucket)
        previous.append(future)
        return future

    return hook_in_order


def checkpoint_steps(prefix, rank):
    """The steps this rank has a checkpoint file of."""
    steps = []
    for path in glob.glob(f"{glob.escape(prefix)}.step*.rank{rank}.pt"):
        middle = path[len(prefix) + len(".step"):-len(f".rank{rank}.pt")]
        if middle.isdigit():
            steps.append(int(middle))
    return sorted(steps)


def save_checkpoint(prefix, rank, step, payload, keep=2):
    """Writes PREFIX.step<step>.rank<rank>.pt atomically, then deletes all but the newest `keep`."""
    path = f"{prefix}.step{step}.rank{rank}.pt"
    torch.save(payload, path + ".tmp")
    os.replace(path + ".tmp", path)
    for old in checkpoint_steps(prefix, rank)[:-keep]:
        os.remove(f"{prefix}.step{old}.rank{rank}.pt")


def newest_common_step(prefix, rank, world):
    """The newest step every rank has a file of, or None (collective)."""
    everyone = [None] * world
    dist.all_gather_object(everyone, checkpoint_steps(prefix, rank))
    common = set(everyone[0]).intersection(*everyone[1:])
    return max(common) if common else None


def weights_digest(model):
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hook", choices=["none", "fp16", "powersgd", "dgc"], default="dgc")
    parser.add_argument("--powersgd-rank", type=int, default=1)
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--warmup-epochs", type=float, default=1.0,
                        help="lr ramp, DGC density warm-up, dense steps before PowerSGD")
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--train-examples", type=int, default=0, help="first N (0 = all)")
    parser.add_argument("--test-examples", type=int, default=0, help="first N (0 = all)")
    parser.add_argument("--max-steps", type=int, default=0,
                        help="stop after this many steps in all (timing runs; 0 = all epochs)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per worker")
    parser.add_argument("--json", help="append rank 0's result object to this file")
    parser.add_argument("--checkpoint", help="checkpoint path prefix: write, and resume from, "
                        "PREFIX.step<S>.rank<r>.pt (see above)")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="also checkpoint after every S-th step (0: at epoch ends only)")
    args = parser.parse_args()
    if args.checkpoint and args.hook == "powersgd":
        parser.error("--checkpoint supports --hook none, fp16 and dgc (PowerSGD's state is not saved)")

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    train_x, train_y = load(args.data, "train", args.train_examples)
    test_x, test_y = load(args.data, "test", args.test_examples)
    global_batch = world * args.batch_size
    per_epoch = len(train_x) // global_batch  # the last partial global batch is dropped

    torch.manual_seed(args.seed)
    model = DistributedDataParallel(CNN())
    numel = sum(p.numel() for p in model.parameters())
    counter = ByteCounter()
    state = None
    if args.hook == "dgc":
        import dgc.torch

        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0, weight_decay=0)
        state = dgc.torch.DGCState(
            model, optimizer, iterations_per_epoch=per_epoch, density=args.density,
            warmup_epochs=args.warmup_epochs, momentum=args.momentum,
            weight_decay=args.weight_decay, seed=args.seed)
        model.register_comm_hook(state, dgc.torch.dgc_hook)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                    weight_decay=args.weight_decay)
        if args.hook == "fp16":
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif args.hook == "powersgd":
            state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=args.powersgd_rank,
                start_powerSGD_iter=max(2, int(args.warmup_epochs * per_epoch)),
                use_error_feedback=True, warm_start=True, random_seed=args.seed)
            model.register_comm_hook(state, one_bucket_at_a_time(powerSGD_hook.powerSGD_hook))
    name = args.hook if args.hook != "powersgd" else f"powersgd-rank{args.powersgd_rank}"
    if rank == 0:
        print(f"{name}: {world} workers, batch {args.batch_size} per worker, {per_epoch} steps per "
              f"epoch, {numel} parameters", flush=True)

    warmup_steps = int(args.warmup_epochs * per_epoch)
    sent = {"all": 0, "post_warmup": 0}
    steps = {"all": 0, "post_warmup": 0}
    step_times = []
    accuracy = 0.0
    iteration = 0
    losses = []

    def checkpoint():
        save_checkpoint(args.checkpoint, rank, iteration, {
            "iteration": iteration, "losses": losses, "sent": sent, "steps": steps,
            "model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
            "dgc": state.state_dict() if args.hook == "dgc" else None})

    if args.checkpoint:
        step = newest_common_step(args.checkpoint, rank, world)
        if step is None:
            if rank == 0:
                print(f"no checkpoint under {args.checkpoint} yet: a new run", flush=True)
        else:
            saved = torch.load(f"{args.checkpoint}.step{step}.rank{rank}.pt")
            model.module.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            if args.hook == "dgc":
                state.load_state_dict(saved["dgc"])
            iteration, losses = saved["iteration"], saved["losses"]
            sent, steps = saved["sent"], saved["steps"]
            if rank == 0:
                print(f"resumed from {args.checkpoint}: step {step}", flush=True)

    for epoch in range(iteration // per_epoch, args.epochs):
        model.train()
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        if iteration % per_epoch == 0:
            losses = []
        start = time.perf_counter()
        for b in range(iteration % per_epoch, per_epoch):
            if args.max_steps and iteration >= args.max_steps:
                break
            mine = order[b * global_batch + rank * args.batch_size :][: args.batch_size]
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(args, iteration, per_epoch)
            step_start = time.perf_counter()
            counter.on = True
            before = counter.bytes
            optimizer.zero_grad()
            loss = F.cross_entropy(model(train_x[mine]), train_y[mine])
            loss.backward()
            optimizer.step()
            counter.on = False
            step_times.append(time.perf_counter() - step_start)
            if args.hook == "dgc":
                message = state.last_bytes["message"]
            elif args.hook == "none":
                message = 4 * numel  # DDP's allreduce of the fp32 gradient buckets
            else:
                message = counter.bytes - before
            for key in ("all", "post_warmup"):
                if key == "all" or iteration >= warmup_steps:
                    sent[key] += message
                    steps[key] += 1
            losses.append(loss.item())
            iteration += 1
            if args.checkpoint and args.checkpoint_every and iteration % args.checkpoint_every == 0 \
                    and iteration % per_epoch != 0:
                checkpoint()
        seconds = time.perf_counter() - start

        # Every rank evaluates every world-th test example; the counts are summed.
        model.eval()
        with torch.no_grad():
            x, y = test_x[rank::world], test_y[rank::world]
            correct = torch.tensor([float((model(x).argmax(1) == y).sum()), float(len(y))])
        dist.all_reduce(correct)
        accuracy = (correct[0] / correct[1]).item()
        if rank == 0:
            print(f"epoch {epoch + 1}  train loss {sum(losses) / max(len(losses), 1):.4f}  "
                  f"test accuracy {100 * accuracy:.2f}%  {seconds:.1f} s", flush=True)
        if args.checkpoint and iteration % per_epoch == 0:
            checkpoint()
        if args.max_steps and iteration >= args.max_steps:
            break

    timed = step_times[10:] if len(step_times) > 20 else step_times
    timed = timed or [float("nan")]
    per_step = {k: sent[k] / steps[k] if steps[k] else float("nan") for k in sent}
    result = {
        "hook": name,
        "workers": world,
        "epochs_run": -(-iteration // per_epoch),
        "steps": iteration,
        "test_accuracy": accuracy,
        "message_bytes_per_step": per_step["all"],
        "message_bytes_per_step_post_warmup": per_step["post_warmup"],
        "dense_gradient_bytes": 4 * numel,
        "compression_ratio": 4 * numel / per_step["all"],
        "compression_ratio_post_warmup": 4 * numel / per_step["post_warmup"],
        "step_seconds": sum(timed) / len(timed),
        "step_seconds_median": sorted(timed)[len(timed) // 2],
        "weights_sha256": weights_digest(model),
    }
    if rank == 0:
        print(json.dumps(result), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(result) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
