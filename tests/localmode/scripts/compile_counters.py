"""1 host: torch.compile (Inductor's C++ backend) on a tiny model, one step, then Inductor's
own FX graph cache counters into SM_MODEL_DIR/compile.json: hits mean this job found an
earlier job's compiled graph."""
import json
import os

# As the launcher left it: Inductor sets its default here once it compiles.
cache_dir = os.environ.get("TORCHINDUCTOR_CACHE_DIR")

import torch  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
compiled = torch.compile(model)
loss = compiled(torch.randn(4, 8)).sum()
loss.backward()
record = {
    "hit": counters["inductor"]["fxgraph_cache_hit"],
    "miss": counters["inductor"]["fxgraph_cache_miss"],
    "inductor_cache_dir": cache_dir,
    "loss_finite": bool(torch.isfinite(loss)),
}
print(f"[test-script] compile counters {json.dumps(record)}")
with open(os.path.join(os.environ["SM_MODEL_DIR"], "compile.json"), "w") as f:
    json.dump(record, f)
