#!/usr/bin/env python3
"""The GPU image's stack, checked where it ships: run by the image's own Python at build time
(Dockerfile.gpu's `sagemaker` stage) and again on the built image by
scripts/check-gpu-image.sh (`docker run -i --entrypoint python3 IMAGE - < this file`).

No GPU and no driver are needed: what needs the driver (libcuda.so.1, which the NVIDIA
container runtime mounts on a GPU host) is listed as "on a GPU only" and checked by
scripts/gpu_smoke.py on a GPU. Prints one line per check; exits 1 when one fails.

  - torch is a CUDA build whose CUDA is the image's (CUDA_VERSION, major.minor); the cuDNN and
    NCCL that torch loads (both from torch's own wheels) and their versions;
  - Horovod was built with NCCL, MPI and Gloo ops (hvd.nccl_built(), mpi_built(), gloo_built());
  - mpi4py loads the image's MPI (the Open MPI that `mpirun --version` reports);
  - torch.compile's prerequisites: Inductor's C++ backend (g++, Python.h) and Triton's (gcc,
    Python.h, Triton's own ptxas runs, its launcher source is there);
  - /etc/byoc/build-versions.env names NCCL, CUDA, TORCH and the EFA installer (or none).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig

RESULTS: list[tuple[bool, str]] = []


def check(ok: bool, text: str) -> None:
    RESULTS.append((bool(ok), text))
    print(f"{'ok  ' if ok else 'FAIL'} {text}", flush=True)


def check_torch() -> None:
    import torch

    image_cuda = os.environ.get("CUDA_VERSION", "")
    cuda = torch.version.cuda
    same = bool(cuda) and cuda.split(".")[:2] == image_cuda.split(".")[:2]
    check(same, f"torch {torch.__version__} is a CUDA {cuda} build; the image's CUDA is {image_cuda or '(unset)'}")
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    check(bool(cudnn), f"torch loads cuDNN {cudnn}")
    nccl = ".".join(str(p) for p in torch.cuda.nccl.version())
    check(bool(nccl), f"torch loads NCCL {nccl}")
    check(True, f"on a GPU only: torch.cuda.is_available() is {torch.cuda.is_available()} here "
                f"(the driver, libcuda.so.1, is mounted by the NVIDIA container runtime; scripts/gpu_smoke.py)")


def check_horovod() -> None:
    import horovod.torch as hvd

    built = {"NCCL": hvd.nccl_built(), "MPI": hvd.mpi_built(), "Gloo": hvd.gloo_built()}
    check(all(built.values()), "Horovod built with " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in built.items()))


def check_mpi4py() -> None:
    import mpi4py

    mpi4py.rc.initialize = False
    from mpi4py import MPI

    library = MPI.Get_library_version().splitlines()[0]
    mpirun = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, check=False).stdout
    version = re.search(r"\(Open MPI\) (\d+(?:\.\d+)+)", mpirun)
    ok = bool(version) and "Open MPI" in library and f"v{version.group(1)}" in library
    check(ok, f"mpi4py loads {library.strip()}; mpirun is Open MPI {version.group(1) if version else '?'} "
              f"({shutil.which('mpirun')})")


def check_compilers() -> None:
    include = sysconfig.get_paths()["include"]
    python_h = os.path.exists(os.path.join(include, "Python.h"))
    compilers = {name: shutil.which(name) for name in ("gcc", "g++")}
    check(python_h and all(compilers.values()),
          f"torch.compile's compilers: g++ {compilers['g++']}, gcc {compilers['gcc']}, Python.h in {include} "
          f"{'present' if python_h else 'MISSING'}")
    import triton

    backend = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia")
    ptxas = os.path.join(backend, "bin", "ptxas")
    runs = os.access(ptxas, os.X_OK) and subprocess.run([ptxas, "--version"], capture_output=True,
                                                        check=False).returncode == 0
    launcher = os.path.exists(os.path.join(backend, "driver.c"))
    check(runs and launcher, f"Triton {triton.__version__}: its ptxas runs ({ptxas}), its launcher source "
                             f"driver.c {'present' if launcher else 'MISSING'}; the launcher compiles against "
                             f"libcuda at a job's first use: on a GPU only")


def check_build_versions(path: str = "/etc/byoc/build-versions.env") -> None:
    with open(path, encoding="utf-8") as f:
        values = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    missing = [key for key in ("NCCL", "CUDA", "TORCH", "EFA_INSTALLER") if key not in values]
    check(not missing, f"{path}: " + ", ".join(f"{k}={v}" for k, v in values.items())
                       + (f"; missing {', '.join(missing)}" if missing else ""))


def main() -> int:
    for step in (check_torch, check_horovod, check_mpi4py, check_compilers, check_build_versions):
        try:
            step()
        except Exception as error:  # one failing check must not hide the others
            check(False, f"{step.__name__}: {type(error).__name__}: {error}")
    failed = [text for ok, text in RESULTS if not ok]
    print(f"check-gpu-stack: {len(RESULTS) - len(failed)} of {len(RESULTS)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
