"""What every training script does around its backend: parse, set up, run, report errors."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Callable, Mapping, Sequence

from train.config import HyperparameterError, TrainConfig, parse_config
from train.loop import TrainResult, run_training
from train.paths import parse_job_paths


def end_without_teardown(code: int = 0) -> None:
    """End this rank now, once its run is over and everything it wrote is closed (checkpoints,
    the model, metrics; the process group destroyed), skipping the interpreter's teardown.

    Why: Gloo's C++ worker threads can still hold finished work objects whose tensors refer to
    Python objects; freeing them while the interpreter is torn down aborts the process (SIGABRT,
    "terminate called without an active exception", pytorch/pytorch#179291). Seen here after a
    successful DDP run's last line, on a loaded machine (2 runs of ~900 in one CI run), turning
    a finished job into a failed one. What must still run at exit runs first: MPI_Finalize
    where mpi4py initialized MPI (mpirun calls a rank that exits without it a failure)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def write_failure(environ: Mapping[str, str], message: str) -> None:
    """output/failure is what SageMaker shows as FailureReason; keep one that is already there.
    Any text arrives readable (control characters and lone surrogates escaped, the entrypoint's
    policy), never an encoding error in place of the reason."""
    from entrypoint.rank.record_errors import build_readable_text

    path = os.path.join(parse_job_paths(environ).output_dir, "failure")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "x", encoding="utf-8") as f:
            f.write(build_readable_text(message)[:1024])
    except OSError:
        pass  # already written (first failure wins) or not writable outside SageMaker


def run_script(build_backend: Callable[[TrainConfig, Mapping[str, str]], object],
               argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> TrainResult:
    environ = os.environ if environ is None else environ
    argv = sys.argv[1:] if argv is None else argv
    try:
        config = parse_config(argv)
    except HyperparameterError as err:
        write_failure(environ, f"bad hyperparameter: {err}")
        raise SystemExit(f"error: {err}") from None
    backend = build_backend(config, environ)
    try:
        result = run_training(config, backend, environ)
    except SystemExit:
        raise
    except BaseException as err:
        rank = backend.rank_info.rank
        write_failure(environ, f"rank {rank}: {type(err).__name__}: {err}\n{traceback.format_exc()}")
        try:
            backend.abort()
        except Exception:  # already failing: the first error is the one to report
            pass
        raise
    backend.finish()
    return result
