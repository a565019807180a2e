"""Which records each rank trains on, step by step. Pure functions of (seed, epoch, rank).

Every rank computes the same permutation of the epoch's records; global batch t is the
slice [t*G, (t+1)*G) of it (G = per-rank batch x ranks), and rank r takes the r-th contiguous
part. Concatenating the ranks' batches in rank order gives exactly the global batch, so one
process with batch G sees the same data as the whole job: the correctness tests rely on it.
The last incomplete global batch of an epoch is dropped, so every rank makes the same
number of steps.
"""

from __future__ import annotations

import numpy as np


def build_epoch_order(num_records: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(num_records)
    return np.random.default_rng([seed, epoch]).permutation(num_records)


def build_steps_per_epoch(num_records: int, batch_size: int, shard_count: int) -> int:
    return num_records // (batch_size * shard_count)


def build_batch_indices(order: np.ndarray, step_in_epoch: int, batch_size: int,
                        shard_index: int, shard_count: int) -> np.ndarray:
    start = (step_in_epoch * shard_count + shard_index) * batch_size
    return order[start:start + batch_size]


def build_eval_indices(num_records: int, shard_index: int, shard_count: int) -> np.ndarray:
    """Validation: every record exactly once over all ranks (no dropping)."""
    return np.arange(shard_index, num_records, shard_count)
