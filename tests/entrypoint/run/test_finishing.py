"""The end of a job through the real entrypoint: nothing a script leaves in a folder it can
write to blocks it (a FIFO under a name we read or write), and one bad rank file loses only
itself in the job report. The deadline and the stop while finishing: tests/entrypoint/roles/test_roles.py
(each step) and tests/multihost/test_faults.py (each multi-host role)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support.jobtree import run_entrypoint, write_tree  # noqa: E402

MAKE_FIFO = """import os
os.mkfifo({path!r}.replace('RANKS', os.environ['BYOC_REPORT_DIR']))
print('trained')
"""


@pytest.mark.parametrize("where", [
    "RANKS/rank-0.json",  # read by the report: open() waited for a writer for good
    "RANKS/rank-7.json",
    "output/data/report/.report.json.tmp",  # written by the report
    "output/success",  # written with the outcome
])
def test_a_fifo_the_script_leaves_where_we_read_or_write_blocks_nothing(tmp_path, where):
    root = write_tree(tmp_path / "ml", script="")
    (root / "output/data/report").mkdir(parents=True)
    (root / "code/train.py").write_text(MAKE_FIFO.format(path=where if where.startswith("RANKS") else str(root / where)))
    done = run_entrypoint(root, BYOC_RUNTIME_DIR=str(tmp_path / "run"))  # a hang here is the bug: timeout
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    if where == "output/success":
        assert "output/success: not a regular file" in done.stderr
    else:
        assert (root / "output/success").exists()
        report = json.loads((root / "output/data/report/report.json").read_text())
        assert report["job"]["exit_code"] == 0


BAD_RANK_FILES = """import json, os
folder = os.environ['BYOC_REPORT_DIR']
def rank(n, **fields):
    with open(os.path.join(folder, f'rank-{n}.json'), 'w') as f:
        json.dump({'rank': n, 'local_rank': n, 'host': 'algo-1', 'steps': 3,
                   'series': {'step': [1, 2, 3], 'step_ms': [10.0, 11.0, 12.0], 'wait_ms': [1.0, 1.0, 1.0]},
                   **fields}, f)
rank(0)
rank(1, series={'step': [1, 2, 3], 'step_ms': [10.0, float('nan'), float('inf')], 'wait_ms': [1.0, 1.0, 1.0]})
rank(2, steps=float('inf'), first_step_at=float('-inf'))
rank(3, series={'step': [1, 2, 3], 'step_ms': [10.0, 11.0, 12.0], 'wait_ms': ['slow', 1.0, 1.0]})
rank(4, series=['not', 'a', 'dict'])
with open(os.path.join(folder, 'rank-5.json'), 'w') as f:
    f.write('{"rank": 5, "series": ')
print('trained')
"""


def test_one_bad_rank_file_loses_only_its_bad_figures_or_itself(tmp_path):
    root = write_tree(tmp_path / "ml", script=BAD_RANK_FILES)
    done = run_entrypoint(root, BYOC_RUNTIME_DIR=str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert "not written" not in done.stderr
    report = json.loads((root / "output/data/report/report.json").read_text())
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3]  # 4 and 5 are not figures
    assert ranks[0]["steps"] == 3 and ranks[0]["step_ms"] == 11.0
    assert ranks[1]["series"]["step"] == [1] and ranks[1]["step_ms"] == 10.0  # steps 2 and 3 left out
    assert ranks[2]["steps"] == 0 and ranks[2]["step_ms"] == 11.0
    assert ranks[3]["series"]["step"] == [2, 3] and ranks[3]["wait_ms"] == 1.0
    notes = " ".join(report["notes"])
    for name in ("rank-1.json", "rank-3.json", "rank-4.json", "rank-5.json"):
        assert name in notes, notes
