"""What /etc/byoc/bash-env.sh costs each bash of an SDK v3 job: the time of N `bash -c :`
starts, with and without BASH_ENV, in a container of the image laid out as v3's local mode
lays out an MPI job (tests/localmode/v3_harness), the two interleaved over --repeats rounds.

    .venv/bin/python benchmarks/bash_env.py [--starts 200] [--repeats 5]

Prints the median microseconds per bash start of each, and the difference.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from localmode.v3_harness import run_build_image, start_v3_hosts, stop_v3_hosts  # noqa: E402
from support.docker import decide_image_tag  # noqa: E402


def measure_per_bash_us(hosts, starts: int, with_env: bool) -> int:
    loop = (f"s=$(date +%s%N); for i in $(seq {starts}); do bash -c :; done; "
            f"echo $(( ($(date +%s%N) - s) / {starts * 1000} ))")
    argv = ["bash", "-c", loop] if with_env else ["env", "-u", "BASH_ENV", "bash", "-c", loop]
    done = hosts.exec("algo-1", *argv)
    return int(done.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    image = run_build_image(decide_image_tag(os.environ))
    with tempfile.TemporaryDirectory() as tmp:
        hosts = start_v3_hosts(Path(tmp), image, ["algo-1", "algo-2"], stranger=False)
        try:
            rounds = [(measure_per_bash_us(hosts, args.starts, True), measure_per_bash_us(hosts, args.starts, False))
                      for _ in range(args.repeats)]
        finally:
            stop_v3_hosts(hosts)
    with_env = statistics.median(r[0] for r in rounds)
    without = statistics.median(r[1] for r in rounds)
    print(f"bash start, µs (median of {args.repeats} × {args.starts}): with BASH_ENV {with_env:.0f}, "
          f"without {without:.0f}, difference {with_env - without:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
