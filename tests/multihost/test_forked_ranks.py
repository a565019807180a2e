"""Forked ranks (BYOC_FORK_RANKS=1, the default) on 2 emulated hosts behave as started ones
(issue 62): a script that writes nothing ends; a script that sets the spawn start method runs;
logging's handlers are flushed at exit; every rank and every attempt draws its own random
numbers. One host, and many scripts compared field by field:
tests/entrypoint/rank/test_forked_like_started.py."""

import json
import os

from localcluster import EmulatedCluster
from support.multihost import ENTRYPOINT, FAST, job, needs_root

pytestmark = needs_root


def test_a_script_that_writes_nothing_ends_on_two_hosts():
    """It hung in 1 run of about 6 here (in 6 of 6 in the image): the program's globals freed
    as it returned, a DDP reducer's gloo group waited for a thread that waited for the GIL."""
    with EmulatedCluster(["algo-1", "algo-2"], job("silent_ddp.py", "torch_distributed")) as cluster:
        result = cluster.run_all(ENTRYPOINT, env={**FAST, "PYTHONUNBUFFERED": "1"}, timeout=180)
        assert result.ok, {h: r.output[-3000:] for h, r in result.results.items()}
        ranks = [json.load(open(os.path.join(cluster.model_dir, f"rank-{r}.json"))) for r in (0, 1)]
        assert [(r["rank"], r["world"], r["steps"]) for r in ranks] == [(0, 2, 50), (1, 2, 50)]


def test_spawn_logging_and_seeds_as_a_started_rank_on_two_hosts_and_two_attempts():
    spec = job("forked_like_started.py", "torch_distributed", **{"fail-first-attempt": 1})
    with EmulatedCluster(["algo-1", "algo-2"], spec) as cluster:
        result = cluster.run_all(ENTRYPOINT, env={**FAST, "BYOC_MAX_RESTARTS": "1"}, timeout=240)
        assert result.ok, {h: r.output[-3000:] for h, r in result.results.items()}
        model = cluster.model_dir
        drew = [json.load(open(os.path.join(model, f"drew-{r}-{a}.json"))) for r in (0, 1) for a in ("1", "2")]
        # set_start_method("spawn") under __main__ worked, and the spawned child ran.
        assert {(d["start_method"], d["process"]) for d in drew} == {("spawn", "MainProcess")}
        for r in (0, 1):
            for a in ("1", "2"):
                with open(os.path.join(model, f"child-{r}-{a}.txt")) as f:
                    assert f.read() == "Process-1"
                # logging's exit handler flushed the MemoryHandler: all 5 lines.
                with open(os.path.join(model, f"log-{r}-{a}.txt")) as f:
                    assert f.read().splitlines() == [f"line {i}" for i in range(5)]
        # Each rank, each attempt, its own draws: a fork copied torchrun's generators.
        for source in ("torch_seed", "torch", "numpy", "random"):
            assert len({d[source] for d in drew}) == 4, (source, drew)
