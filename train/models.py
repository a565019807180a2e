"""The default model (an MLP) and the file that rank 0 writes to SM_MODEL_DIR.

model.pt holds only tensors and plain Python values, so plain `torch.load(path)` reads it
(weights_only loading, torch's default): {"format", "arch", "state_dict", "metrics"}.
"""

from __future__ import annotations

import os

import torch
from torch import nn

MODEL_FILE = "model.pt"
MODEL_FORMAT = "byoc-train-mlp/1"


def build_mlp(in_features: int, num_classes: int, hidden_sizes: tuple[int, ...] | list[int],
              batchnorm: bool = False) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_features
    for hidden in hidden_sizes:
        layers.append(nn.Linear(width, hidden))
        if batchnorm:
            layers.append(nn.BatchNorm1d(hidden))
        layers.append(nn.ReLU())
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def build_model_from_arch(arch: dict) -> nn.Module:
    return build_mlp(arch["in_features"], arch["num_classes"], arch["hidden_sizes"], arch["batchnorm"])


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP (or anything else with `.module`)."""
    return getattr(model, "module", model)


def save_model(model: nn.Module, arch: dict, model_dir: str, metrics: dict | None = None) -> str:
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(model_dir, MODEL_FILE)
    state = {k: v.detach().cpu().clone() for k, v in unwrap(model).state_dict().items()}
    partial = f"{path}.partial"
    torch.save({"format": MODEL_FORMAT, "arch": dict(arch), "state_dict": state,
                "metrics": dict(metrics or {})}, partial)
    os.replace(partial, path)
    return path


def load_model(path: str) -> nn.Module:
    saved = torch.load(path, map_location="cpu")
    if saved.get("format") != MODEL_FORMAT:
        raise ValueError(f"{path}: not a model saved by train.models (format {saved.get('format')!r})")
    model = build_model_from_arch(saved["arch"])
    model.load_state_dict(saved["state_dict"])
    return model
