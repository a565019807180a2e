"""The check after the venv reaches the runtime: torch.compile (Inductor's C++ backend, the
CPU default) compiles and runs a tiny function in the image's own Python, with the image's
g++ and Python headers. Its cache goes to a temporary folder, so no build artefact stays."""

import os
import tempfile

with tempfile.TemporaryDirectory() as cache:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    import torch

    x = torch.arange(8, dtype=torch.float32)
    got = torch.compile(lambda t: torch.relu(t - 3.0) * 2.0)(x)
    assert torch.equal(got, torch.relu(x - 3.0) * 2.0), got
    print(f"check-torch-compile: torch {torch.__version__} compiled and ran a graph")
