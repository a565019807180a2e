"""The training loop every script shares: data -> forward/backward -> backend step, with
metrics, checkpoints (periodic, on SIGTERM, resumed at start), validation and the saved model.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import signal
import socket
import time
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import torch
import torch.nn.functional as F

from train.backend import Backend
from train.batches import (build_batch_indices, build_epoch_order, build_eval_indices,
                           build_steps_per_epoch)
from train.channels import ChannelReader, decide_channel_config, decide_shard, load_input_data_config
from train.checkpoints import CheckpointWriter, load_checkpoint, save_checkpoint
from train.config import TrainConfig
from train.devices import decide_precision, probe_bf16_supported
from train.metrics import Reporter, format_progress
from train.models import build_mlp, save_model, unwrap
from train.paths import load_job_paths
from train.report_hooks import add_samples, set_resumed_step, timed_as
from train.schedule import build_lr, build_peak_lr, build_warmup_steps
from train.watchdog import StepWatchdog

EXIT_STOPPED = 143  # 128 + SIGTERM: stopped on request, checkpoint written


@dataclass(frozen=True)
class TrainResult:
    start_step: int
    end_step: int
    stopped: bool
    validation_accuracy: float | None
    model_path: str | None


class StopRequest:
    """Remembers a SIGTERM (SageMaker's StopTrainingJob, spot interruption) until the loop
    reaches a step boundary where all ranks can agree to checkpoint and stop."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def install(self) -> None:
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def build_step_seed(seed: int, rank: int, step: int) -> int:
    # A seed per (rank, step): dropout & co. replay identically after a resume, no RNG state saved.
    return (seed * 1_000_003 + rank * 7_919 + step) % (2**63)


def build_optimizer(config: TrainConfig, params, lr: float) -> torch.optim.Optimizer:
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=config.momentum, weight_decay=config.weight_decay)


def build_arch(config: TrainConfig, in_features: int, num_classes: int) -> dict:
    return {"name": config.model, "in_features": in_features, "num_classes": num_classes,
            "hidden_sizes": list(config.hidden_sizes), "batchnorm": config.batchnorm}


def _to_device(table, indices: np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(table.x[indices]).reshape(len(indices), -1)
    y = torch.from_numpy(table.y[indices])
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def build_parameter_digest(model) -> int:
    """A 48-bit digest of the exact bytes of every parameter and buffer (exact in a float64,
    so ranks can compare digests with a min/max reduction)."""
    h = hashlib.sha256()
    for name, tensor in sorted(unwrap(model).state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return int.from_bytes(h.digest()[:6], "big")


def verify_replicas(model, backend: Backend) -> int:
    """Every rank of an allreduce (or synchronous PS) job must end with the same weights."""
    digest = build_parameter_digest(model)
    low, = backend.reduce([float(digest)], "min")
    high, = backend.reduce([float(digest)], "max")
    if low != high:
        raise RuntimeError(f"rank {backend.rank_info.rank}: parameters differ between ranks"
                           f" (digests {int(low):#x} .. {int(high):#x})")
    return digest


def evaluate(model, table, shard, backend: Backend, batch_size: int = 1024) -> tuple[float, float]:
    """(accuracy, mean loss) over every validation record, each counted once across ranks."""
    model.eval()
    indices = build_eval_indices(len(table), shard.index, shard.count)
    correct = loss_sum = 0.0
    with torch.no_grad():
        for start in range(0, len(indices), batch_size):
            x, y = _to_device(table, indices[start:start + batch_size], backend.device)
            out = model(x).float()
            loss_sum += F.cross_entropy(out, y, reduction="sum").item()
            correct += (out.argmax(1) == y).sum().item()
    correct, loss_sum, total = backend.reduce([correct, loss_sum, float(len(indices))], "sum")
    model.train()
    return correct / max(1.0, total), loss_sum / max(1.0, total)


def format_checkpoint_saved(step: int, checkpoint_dir: str, paused_s: float, write_s: float | None = None,
                            write_cpu_s: float = 0.0) -> str:
    """The line that says a checkpoint is durably in place (logged only then: restarts and
    people rely on it). paused_s: the training thread's time on it; write_s, write_cpu_s:
    the writer thread's time on it, and the CPU time it used."""
    where = f"[checkpoint] saved step {step} to {checkpoint_dir}"
    if write_s is None:
        return f"{where} (took {paused_s * 1000:.2f} ms on the training thread)"
    return (f"{where} (took {paused_s * 1000:.2f} ms on the training thread; written in {write_s * 1000:.1f} ms,"
            f" {write_cpu_s * 1000:.1f} ms of CPU, by the checkpoint writer)")


def build_checkpoint_writer(checkpoint_dir: str, reporter: Reporter) -> CheckpointWriter:
    return CheckpointWriter(
        checkpoint_dir,
        on_saved=lambda step, path, paused_s, write_s, write_cpu_s: reporter.line(
            format_checkpoint_saved(step, checkpoint_dir, paused_s, write_s, write_cpu_s)),
        on_failed=lambda step, err: reporter.line(f"[checkpoint] step {step} not saved: {err}"),
        on_waited=lambda step, waited_s: reporter.line(
            f"[checkpoint] step {step} waited {waited_s * 1000:.1f} ms for the previous checkpoint's write"
            f" (checkpoint_every is shorter than one write)"))


def run_training(config: TrainConfig, backend: Backend, environ: Mapping[str, str]) -> TrainResult:
    ranks = backend.rank_info
    paths = load_job_paths(environ)
    reporter = Reporter(ranks.is_leader, paths.tensorboard_dir)
    stop = StopRequest()
    stop.install()
    backend.stop_request = stop  # a parameter server passes it along with the gradients
    host = environ.get("SM_CURRENT_HOST") or socket.gethostname()
    watchdog = StepWatchdog(config.hang_timeout_s, ranks.rank, host).start()
    writer = build_checkpoint_writer(paths.checkpoint_dir, reporter)
    try:
        return _train(config, backend, environ, paths, reporter, stop, watchdog, writer)
    finally:
        writer.close()  # after an error too: a write in flight lands (the watchdog still runs)
        watchdog.stop()
        stop.uninstall()
        reporter.close()


def _train(config, backend, environ, paths, reporter, stop, watchdog, writer) -> TrainResult:
    ranks, device = backend.rank_info, backend.device
    seed_everything(config.seed)
    channels = load_input_data_config(environ, paths.input_config_dir)
    train_channel = decide_channel_config(config.train_channel, channels)
    shard = decide_shard(train_channel.distribution, ranks.rank, ranks.world_size,
                         ranks.local_rank, ranks.local_world_size)
    reader = ChannelReader(train_channel, environ, paths.input_data_dir, ranks.local_rank, ranks.local_world_size)
    table = reader.load_pass()
    steps_per_epoch = build_steps_per_epoch(len(table), config.batch_size, shard.count)
    num_classes = config.num_classes or int(table.y.max()) + 1
    if shard.group == "host":  # hosts hold different data: agree on what every rank can do
        steps_per_epoch, neg_classes = backend.reduce([steps_per_epoch, -num_classes], "min")
        steps_per_epoch, num_classes = int(steps_per_epoch), int(-neg_classes)
    if steps_per_epoch < 1:
        raise ValueError(f"channel {config.train_channel!r} has {len(table)} records: fewer than one global"
                         f" batch ({config.batch_size} x {shard.count} ranks)")
    total_steps = config.epochs * steps_per_epoch
    if config.max_steps:
        total_steps = min(total_steps, config.max_steps)

    arch = build_arch(config, int(np.prod(table.x.shape[1:])), num_classes)
    model = build_mlp(arch["in_features"], num_classes, config.hidden_sizes, config.batchnorm).to(device)
    peak_lr = build_peak_lr(config.lr, ranks.world_size, config.scale_lr)
    warmup_steps = build_warmup_steps(config.warmup_epochs, steps_per_epoch)
    optimizer = build_optimizer(config, model.parameters(), peak_lr)
    precision = decide_precision(config.precision, device.type, probe_bf16_supported(device.type))
    scaler = torch.amp.GradScaler(device.type) if precision.grad_scaler else None

    checkpoint = backend.broadcast_object(load_checkpoint(paths.checkpoint_dir) if ranks.is_leader else None)
    start_step = 0
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        if checkpoint.get("optimizer") is not None:
            optimizer.load_state_dict(checkpoint["optimizer"])
        start_step = int(checkpoint["step"])
    train_model, optimizer, start_step = backend.prepare(model, optimizer, start_step, checkpoint)
    set_resumed_step(start_step)
    if start_step:
        reporter.line(f"[checkpoint] resumed from {paths.checkpoint_dir} at step {start_step}")
    reporter.line(f"[setup] backend={backend.name} world_size={ranks.world_size} device={device}"
                  f" steps={total_steps} steps_per_epoch={steps_per_epoch} global_batch="
                  f"{config.batch_size * ranks.world_size} peak_lr={peak_lr:g} warmup_steps={warmup_steps}"
                  f" precision={precision.autocast_dtype or 'fp32'}"
                  + (f" {backend.cpu_plan.describe()}" if backend.cpu_plan is not None else ""))

    def write_checkpoint(step: int, wait: bool) -> None:
        """The step's state, copied now (before the next step changes it), written by the
        background writer; wait: until it is on disk (a stop), as every write is without
        checkpoint_background. Ranks meet after a write that was waited for."""
        started = time.perf_counter()
        if config.checkpoint_background:
            writer.reserve(step)  # the previous write ends (or raises) before this copy is taken
        state = backend.checkpoint_state(train_model, optimizer)
        if state is not None and config.checkpoint_background:
            writer.submit(step, {"step": step, **state}, started)
            if wait:
                writer.wait()
        elif state is not None:
            save_checkpoint(paths.checkpoint_dir, {"step": step, **state})
            reporter.line(format_checkpoint_saved(step, paths.checkpoint_dir, time.perf_counter() - started))
        if wait or not config.checkpoint_background:
            backend.barrier()

    autocast = (torch.autocast(device.type, dtype=precision.autocast_dtype)
                if precision.autocast_dtype is not None else contextlib.nullcontext())
    epoch_loaded = start_step // steps_per_epoch
    order = build_epoch_order(len(table), config.seed, epoch_loaded, config.shuffle)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    loss_count = 0
    stopped = False
    window_start, window_step, run_start = time.perf_counter(), start_step, time.perf_counter()
    global_batch = config.batch_size * ranks.world_size
    step = start_step
    train_model.train()
    while step < total_steps:
        epoch, in_epoch = divmod(step, steps_per_epoch)
        if epoch != epoch_loaded:
            with timed_as("data_wait"):  # a Pipe-mode channel is read again each epoch
                table, epoch_loaded = reader.load_pass(), epoch
            order = build_epoch_order(len(table), config.seed, epoch, config.shuffle)
        with timed_as("data_wait"):
            x, y = _to_device(table, build_batch_indices(order, in_epoch, config.batch_size, shard.index,
                                                         shard.count), device)
        add_samples(len(y))
        lr = build_lr(step, config.lr, peak_lr, warmup_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        torch.manual_seed(build_step_seed(config.seed, ranks.rank, step))
        with autocast:
            loss = F.cross_entropy(train_model(x), y)
        backend.backward_step(loss, optimizer, scaler, lr)
        loss_sum += loss.detach().double()
        loss_count += 1
        step += 1
        watchdog.beat()
        writer.raise_if_failed()  # a background write that failed fails the job at this step

        # Only at steps every rank reaches: a collective here must pair with the same one elsewhere.
        if step % config.log_every == 0 or step == total_steps:
            stopped = backend.agree_stop(stop.requested)
            mean_loss_sum, count = backend.reduce([loss_sum.item(), float(loss_count)], "sum")
            now = time.perf_counter()
            samples_per_s = (step - window_step) * global_batch / max(1e-9, now - window_start)
            mean_step_s = (now - run_start) / max(1, step - start_step)
            mean_loss = mean_loss_sum / max(1.0, count)
            reporter.metrics(epoch, step, {"train_loss": mean_loss, "lr": lr, "samples_per_sec": samples_per_s})
            reporter.line(format_progress(epoch, config.epochs, step, total_steps, mean_loss, samples_per_s,
                                          (total_steps - step) * mean_step_s))
            loss_sum.zero_()
            loss_count, window_start, window_step = 0, now, step
        if stopped or (config.checkpoint_every and step % config.checkpoint_every == 0 and step < total_steps):
            write_checkpoint(step, wait=stopped)
            watchdog.beat()
        if stopped:
            reporter.line(f"[stopped] SIGTERM: stopped at step {step}; the next start resumes from the checkpoint")
            break
    writer.wait()  # the last checkpoint is on disk (or its error raised) before anything else ends
    reader.release_staging()
    if stopped:
        backend.finish()
        raise SystemExit(EXIT_STOPPED)

    watchdog.beat()  # validation and saving the model get a full hang_timeout_s of their own
    if backend.name != "ps":  # PS workers share no collective; sync rounds give all the same answer
        digest = verify_replicas(train_model, backend)
        reporter.line(f"[check] parameters identical on all {ranks.world_size} ranks (digest {digest:#014x})")
    accuracy = model_path = None
    validation = decide_channel_config(config.validation_channel, channels)
    val_dir_exists = validation.mode == "Pipe" or os.path.isdir(
        environ.get(f"SM_CHANNEL_{validation.name.upper()}") or os.path.join(paths.input_data_dir, validation.name))
    final_metrics: dict[str, float] = {}
    if val_dir_exists:
        val_shard = backend.eval_shard(decide_shard(validation.distribution, ranks.rank, ranks.world_size,
                                                    ranks.local_rank, ranks.local_world_size))
        val_reader = ChannelReader(validation, environ, paths.input_data_dir, ranks.local_rank,
                                   ranks.local_world_size)
        accuracy, val_loss = evaluate(train_model, val_reader.load_pass(), val_shard, backend)
        val_reader.release_staging()
        final_metrics = {"validation_accuracy": accuracy, "validation_loss": val_loss}
        reporter.metrics(epoch_loaded, step, final_metrics)
    final_state = backend.checkpoint_state(train_model, optimizer)
    if final_state is not None:
        model_path = save_model(train_model, arch, paths.model_dir, final_metrics)
        if accuracy is not None:
            reporter.line(f"[result] validation_accuracy={accuracy:.4f} model={model_path}")
        else:
            reporter.line(f"[result] model={model_path}")
    backend.barrier()
    return TrainResult(start_step, step, stopped, accuracy, model_path)
