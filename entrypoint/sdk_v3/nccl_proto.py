"""The job's own NCCL protocol choice, given back to the ranks SageMaker SDK v3's drivers start.

v3 (3.27.0) forces NCCL's "simple" protocol: its torchrun driver sets NCCL_PROTO=simple for
every job (torchrun_driver.setup_env), its MPI driver passes `-x NCCL_PROTO=simple` on EFA
instances (mpi_utils.get_mpirun_command). That was a workaround for aws-ofi-nccl 1.5 and older,
whose EFA transport could not carry NCCL's LL and LL128 protocols safely (aws-ofi-nccl's
doc/efa-env-var.md). The plugin this image ships decides by itself: it sets NCCL_PROTO=simple
where the platform needs it (aws-ofi-nccl pull request 850: no GPUDirect RDMA, or a provider
without the platform's configuration) and leaves NCCL its faster protocols elsewhere (p4d, p5).

/etc/byoc/bash-env.sh records, before any driver runs, whether the job set NCCL_PROTO itself:
BYOC_JOB_NCCL_PROTO is `set:<value>` or `unset`. The shims then give the ranks that value, or
no NCCL_PROTO at all where the driver put "simple" on its own. Pure.
"""

from __future__ import annotations

from typing import Mapping, Sequence

JOB_CHOICE_ENV = "BYOC_JOB_NCCL_PROTO"
DRIVERS_CHOICE = "simple"


def parse_job_choice(environ: Mapping[str, str]) -> tuple[bool, str | None]:
    """(known, the job's own NCCL_PROTO or None): known is False outside a v3 job recorded by
    bash-env.sh, where nothing is changed."""
    recorded = environ.get(JOB_CHOICE_ENV, "")
    if recorded == "unset":
        return True, None
    if recorded.startswith("set:"):
        return True, recorded[len("set:"):]
    return False, None


def build_torchrun_env(environ: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """The environment for the real torchrun, and a note when NCCL_PROTO changed."""
    env = dict(environ)
    known, job_value = parse_job_choice(environ)
    current = env.get("NCCL_PROTO")
    if not known or current == job_value:
        return env, None
    if job_value is not None:
        env["NCCL_PROTO"] = job_value
        return env, f"NCCL_PROTO={job_value}, the job's own (SDK v3's driver had set {current})"
    if current == DRIVERS_CHOICE:
        del env["NCCL_PROTO"]
        return env, ("NCCL_PROTO unset: SDK v3's driver forces \"simple\", a workaround for aws-ofi-nccl <= 1.5; "
                     "this image's plugin and NCCL choose the protocol")
    return env, None


def build_mpirun_argv(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[list[str], str | None]:
    """v3's mpirun argv with its `-x NCCL_PROTO=simple` replaced by the job's own choice, or
    dropped when the job made none; a note when it changed."""
    known, job_value = parse_job_choice(environ)
    out = list(argv)
    for i in range(len(out) - 1):
        if out[i] == "-x" and out[i + 1] == f"NCCL_PROTO={DRIVERS_CHOICE}" and known:
            if job_value is None:
                del out[i:i + 2]
                return out, ("-x NCCL_PROTO=simple dropped: a workaround for aws-ofi-nccl <= 1.5; this image's "
                             "plugin and NCCL choose the protocol")
            if job_value != DRIVERS_CHOICE:
                out[i + 1] = f"NCCL_PROTO={job_value}"
                return out, f"-x NCCL_PROTO=simple -> NCCL_PROTO={job_value}, the job's own"
            return out, None
    return out, None
