"""Hyperparameters: what a training script accepts, parsed from SageMaker-style CLI args.

SageMaker hands hyperparameters to the script as `--key value` pairs (keys sorted). Values
that are not strings arrive JSON-encoded (`0.1`, `true`, `["a","b"]`); older toolkits render
lists and bools with Python's str() (`['a', 'b']`, `True`), so that is accepted too.
Unknown keys are an error: a typo must not silently train with a default.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import typing
from dataclasses import dataclass
from typing import Sequence


CPU_BINDINGS = ("auto", "none")


@dataclass(frozen=True)
class TrainConfig:
    # schedule
    epochs: int = 10
    max_steps: int = 0  # stop after this many optimizer steps in all (0: no limit)
    batch_size: int = 64  # per rank; the global batch is batch_size x world size
    # optimizer and the large-minibatch recipe (Goyal et al. 2017)
    optimizer: str = "sgd"  # sgd | adam
    lr: float = 0.05  # for one rank's batch; scaled by the world size when scale_lr
    momentum: float = 0.9
    weight_decay: float = 0.0
    scale_lr: bool = True  # linear scaling rule: peak lr = lr x world size
    warmup_epochs: float = 0.0  # linear warmup from lr to the peak over this many epochs
    # model
    model: str = "mlp"
    hidden_sizes: tuple[int, ...] = (256, 256)
    batchnorm: bool = False
    num_classes: int = 0  # 0: one more than the largest training label
    sync_batchnorm: bool = False  # batch statistics over the global batch (ddp, horovod)
    # numerics and communication
    seed: int = 1
    precision: str = "auto"  # auto | fp32 | bf16 | fp16 (auto: bf16/fp16 on GPU, fp32 elsewhere)
    grad_compression: str = "none"  # none | fp16 | bf16: gradients travel in 16 bits
    bucket_mb: float = 4.0  # gradient bucket size (DDP and the mpi4py trainer)
    cpu_binding: str = "auto"  # auto | none: on CPU, each of a host's ranks on its own cores
    # data
    train_channel: str = "train"
    validation_channel: str = "validation"
    shuffle: bool = True
    # bookkeeping
    log_every: int = 10  # steps between metric lines
    checkpoint_every: int = 100  # steps between checkpoints (0: only on SIGTERM)
    checkpoint_background: bool = True  # written by a writer thread (false: the training waits for each write)
    hang_timeout_s: float = 1800.0  # a rank with no finished step for this long fails the job (0: never)
    # parameter server
    ps_mode: str = "sync"  # sync | async

    def __post_init__(self) -> None:
        choices = {
            "optimizer": ("sgd", "adam"),
            "precision": ("auto", "fp32", "bf16", "fp16"),
            "grad_compression": ("none", "fp16", "bf16"),
            "ps_mode": ("sync", "async"),
            "model": ("mlp",),
            "cpu_binding": CPU_BINDINGS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"--{name} {getattr(self, name)!r}: expected one of {', '.join(allowed)}")
        positive = ("epochs", "batch_size", "log_every")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_steps", "num_classes", "checkpoint_every", "warmup_epochs", "weight_decay", "momentum",
                     "hang_timeout_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0 or self.bucket_mb <= 0:
            raise ValueError("--lr and --bucket_mb must be > 0")
        if any(h < 1 for h in self.hidden_sizes):
            raise ValueError(f"--hidden_sizes must be positive integers, got {list(self.hidden_sizes)}")


class HyperparameterError(ValueError):
    pass


def _decode(raw: str) -> object:
    """JSON first (what the SDK sends), then a Python literal (what old toolkits send), else the string."""
    for loader in (json.loads, ast.literal_eval):
        try:
            return loader(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return raw


def _coerce(name: str, annotation: object, raw: str) -> object:
    value = _decode(raw)
    if annotation is str:
        # A string hyperparameter keeps its text even when it looks like JSON ("1", "true").
        return value if isinstance(value, str) else raw
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise HyperparameterError(f"--{name} {raw!r}: expected true or false")
    if annotation is int:
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
            raise HyperparameterError(f"--{name} {raw!r}: expected an integer")
        return int(value)
    if annotation is float:
        # NaN and infinities (JSON's NaN, 1e999) are no learning rate: refused like the
        # entrypoint's settings (entrypoint/decide/numbers.py).
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and (
            not isinstance(value, int) or abs(value) < 2 ** 1000) else math.nan
        if not math.isfinite(number):
            raise HyperparameterError(f"--{name} {raw!r}: expected a finite number")
        return number
    if typing.get_origin(annotation) is tuple:
        (item_type, _ellipsis) = typing.get_args(annotation)
        if not isinstance(value, (list, tuple)):
            raise HyperparameterError(f"--{name} {raw!r}: expected a JSON list such as [256, 256]")
        return tuple(_coerce(name, item_type, json.dumps(v) if not isinstance(v, str) else v) for v in value)
    raise TypeError(f"no parser for {annotation!r}")  # a new field type needs a branch here


def parse_config(argv: Sequence[str], base: TrainConfig | None = None) -> TrainConfig:
    """`--key value` / `--key=value` pairs -> TrainConfig (defaults from `base`)."""
    hints = typing.get_type_hints(TrainConfig)
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    values: dict[str, object] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-") or arg in ("-", "--"):
            raise HyperparameterError(f"unexpected argument {arg!r}: hyperparameters come as --key value")
        key, has_value, raw = arg.lstrip("-").partition("=")
        if not has_value:
            if i + 1 >= len(args):
                raise HyperparameterError(f"--{key} has no value")
            raw = args[i + 1]
            i += 1
        i += 1
        name = key.replace("-", "_")
        if name not in known:
            raise HyperparameterError(
                f"unknown hyperparameter --{key}; known: {', '.join(sorted(known))}")
        values[name] = _coerce(name, hints[name], raw)
    try:
        return dataclasses.replace(base or TrainConfig(), **values)
    except ValueError as err:
        raise HyperparameterError(str(err)) from None

