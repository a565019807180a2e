"""The check after the venv reaches the image: torch.compile (Inductor's C++ backend, the
CPU default) compiles and runs a tiny function in the image's own Python, with the image's
g++ and Python headers. Everything it writes (the cache, and the precompiled headers that
Inductor keeps in <tempdir>/torchinductor_<user> whatever TORCHINDUCTOR_CACHE_DIR says) goes
to a temporary folder that is removed, so no build artefact reaches a layer."""

import os
import tempfile

with tempfile.TemporaryDirectory() as work:
    tempfile.tempdir = work
    os.environ["TMPDIR"] = work
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(work, "inductor")
    import torch

    x = torch.arange(8, dtype=torch.float32)
    got = torch.compile(lambda t: torch.relu(t - 3.0) * 2.0)(x)
    assert torch.equal(got, torch.relu(x - 3.0) * 2.0), got
    print(f"check-torch-compile: torch {torch.__version__} compiled and ran a graph")
