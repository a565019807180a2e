"""This host's part of the job report, owned by its role (roles/): started when the
plan is decided, marked at each phase, ended when the host's part ends. The leader (or the one
host) writes the report; a worker hands its figures to the leader (roles/).
"""

from __future__ import annotations

import json
import os
import time
from entrypoint.jobreport.figures import fit_figures, load_rank_files
from entrypoint.jobreport.metric_lines import ReportedThroughput
from entrypoint.jobreport.sampler import HostSampler
from entrypoint.decide.job_report import ReportSpec
from entrypoint.settings import DEFAULTS

def probe_process_start() -> float:
    """When this process started (epoch s): the entrypoint's first phase, measured by the
    kernel, before any of our code ran."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


class HostReport:
    def __init__(self, spec: ReportSpec, host: str):
        self.spec, self.host = spec, host
        self.sampler = HostSampler(spec.interval_s, os.getpid(), spec.gpu_count, spec.neuron_cores)
        self.throughput = ReportedThroughput()  # what the script's own lines say (metric_lines.py)
        self.sampler.mark("entrypoint start", probe_process_start())
        self.sampler.mark("job read")
        try:
            os.makedirs(spec.rank_folder, mode=0o700, exist_ok=True)
        except OSError:
            pass  # no rank figures: the ranks find no folder and write none
        self.sampler.start()
        self.live = None  # the live thread (live/loop.py), when the role starts one

    def start_live(self, log, send=None, capacity_ends_at: float | None = None,
                   max_bytes: int = DEFAULTS.live_figures_bytes, job_hosts: int = 1) -> None:
        """The job watched live: a worker's updates to the leader (send), or the leader's
        events and status line; never the job's failure."""
        from entrypoint.jobreport.live.loop import LiveLoop

        try:
            self.live = LiveLoop(self.spec, self.host, self.sampler, self.throughput, log, send, capacity_ends_at,
                                 max_bytes, job_hosts).start()
        except Exception as exc:  # noqa: BLE001
            log(f"job report: the live figures did not start: {type(exc).__name__}: {exc}")

    def stop_live(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.sampler.cpu_s += self.live.cpu_s

    def mark(self, phase: str, when: float | None = None) -> None:
        self.sampler.mark(phase, when)

    def end(self, max_bytes: int) -> tuple[dict, str]:
        """Stop sampling; this host's figures and their JSON, at most max_bytes."""
        self.sampler.stop()
        self.stop_live()
        return self.build_figures(max_bytes)

    def build_figures(self, max_bytes: int) -> tuple[dict, str]:
        self.sampler.mark("end")
        ranks, notes = load_rank_files(self.spec.rank_folder)
        points, phases = self.sampler.snapshot()
        first = [r["first_step_at"] for r in ranks if isinstance(r.get("first_step_at"), (int, float))]
        if first:
            phases.setdefault("first training step", min(first))
        figures, text = fit_figures(self.host, points, phases, ranks, self.spec.interval_s, self.sampler.cores,
                                    self.sampler.cpu_s, max_bytes, self.throughput.median(), notes)
        return figures, text


def write_report_files(output_data_dir: str, report: dict) -> str:
    """output/data/report/report.json and index.html, each made whole first and then moved
    into place (a report that cannot be made leaves no half-written file); returns the folder."""
    from entrypoint.jobreport.page import build_report_page

    texts = {"report.json": json.dumps(report, ensure_ascii=True, allow_nan=False),
             "index.html": build_report_page(report)}
    folder = os.path.join(output_data_dir, "report")
    os.makedirs(folder, exist_ok=True)
    for name, text in texts.items():
        tmp = os.path.join(folder, f".{name}.tmp")
        write_new_file(tmp, text)
        os.replace(tmp, os.path.join(folder, name))
    return folder


def write_new_file(path: str, text: str) -> None:
    """A temporary file in a folder the script can write to (output/data/, the ranks' folder):
    whatever the script left under its name (a FIFO would block the open) is removed first,
    and the file is opened only as a regular one (paths.open_regular)."""
    from entrypoint.job.paths import open_regular

    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    with open_regular(path, write=True) as f:
        f.write(text)


def write_job_report(output_data_dir: str, what: str, leader: str, hosts: tuple[str, ...], exit_code: int,
                     figures: dict[str, dict], notes: list[str], restarts: list[dict] = ()) -> dict:
    """The leader's (or the one host's) last step: report.json, index.html and the summary
    table in the log. Returns the report."""
    from entrypoint.jobreport.build import build_report, build_summary_lines
    from entrypoint.log import log

    report = build_report(what, leader, hosts, exit_code, figures, notes, restarts)
    for line in build_summary_lines(report):
        log(line)
    folder = write_report_files(output_data_dir, report)
    log(f"job report: {os.path.join(folder, 'index.html')} (and report.json; BYOC_REPORT=0 turns it off)")
    return report
