"""`torchrun` as SageMaker SDK v3's torchrun driver calls it, with the job's own NCCL protocol
choice given back to the ranks (sdk_v3/nccl_proto.py), then the image's real torchrun.

/etc/byoc/bash-env.sh puts /usr/local/byoc/sdk-v3/bin (this module as `torchrun`) first on PATH
only in a v3 torchrun job; the arguments pass through untouched; a change is one line on stderr.
"""

from __future__ import annotations

import os
import sys

from entrypoint.sdk_v3.mpirun import SHIM_DIR, probe_real_program
from entrypoint.sdk_v3.nccl_proto import build_torchrun_env

LOG_PREFIX = "byoc sdk-v3 torchrun:"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    real = probe_real_program("torchrun", os.environ.get("PATH", ""), SHIM_DIR,
                              lambda p: os.path.isfile(p) and os.access(p, os.X_OK))
    if real is None:
        print(f"{LOG_PREFIX} no torchrun on PATH besides this shim ({SHIM_DIR})", file=sys.stderr)
        return 127
    env, note = build_torchrun_env(os.environ)
    if note:
        print(f"{LOG_PREFIX} {note}", file=sys.stderr, flush=True)
    os.execve(real, [real, *args], env)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
