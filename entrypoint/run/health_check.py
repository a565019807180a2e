"""Run the deep health check (BYOC_HEALTH_CHECK=deep) on this host, before the role starts:
the plan's check processes (decide/health.py, rank/allreduce_check.py) under the supervisor
like any other step, then the verdict on what they measured. Returns an Outcome when the job
must end here (a figure too low on any host, the check failed or was stopped), else None.

Also run by scripts/gpu_smoke.py --deep (run_check, with a HealthCheck it builds itself).
Imported only when the plan has a check.
"""

from __future__ import annotations

import json
import os
import time

from entrypoint.decide import health
from entrypoint.decide.plan import LaunchPlan
from entrypoint.errors import EXIT_BAD_JOB
from entrypoint.log import log
from entrypoint.outcome.failure import secret_values
from entrypoint.outcome.records import Outcome
from entrypoint.outcome.stops import decide_stop_exit_code
from entrypoint.run.stop import Stop
from entrypoint.run.supervise import OutputCollector, RunHooks, RunResult, run_processes


def run_check(check: health.HealthCheck, env: dict[str, str], stop: Stop, hooks: RunHooks,
              collector: OutputCollector | None = None) -> tuple[RunResult, dict | None]:
    """Run this host's ranks of the check; how they ended and the timings local rank 0 wrote
    (None when it wrote none)."""
    try:
        os.remove(check.result_file)  # a result of an earlier run in a reused folder is not this one's
    except FileNotFoundError:
        pass
    collector = collector or OutputCollector(secret_values(env))
    run = run_processes(check.processes, env, "/", collector, stop, hooks)
    try:
        with open(check.result_file, encoding="utf-8") as f:
            return run, json.load(f)
    except (OSError, ValueError):
        return run, None


def run_health_check(plan: LaunchPlan, env: dict[str, str], stop: Stop) -> Outcome | None:
    check, host = plan.health_check, plan.current_host
    if len(check.hosts) > 1:
        from entrypoint.hosts.net import wait_for_hosts  # a multi-host launch: imported by its role anyway

        if wait_for_hosts((check.leader,), plan.settings.host_resolution_timeout_s, stop.loop, plan.settings) \
                and not stop.loop.stopped():
            return Outcome(EXIT_BAD_JOB, f"Deep health check (BYOC_HEALTH_CHECK=deep) could not start on {host}: "
                                         f"the leader {check.leader}'s name did not resolve within "
                                         f"{plan.settings.host_resolution_timeout_s:g} s "
                                         f"(BYOC_HOST_RESOLUTION_TIMEOUT_S); the training never started.\n")
    log(f"{host}: deep health check: {check.mib} MiB all-reduce ({check.backend}) across "
        f"{check.ranks_per_host} rank(s) on each of {len(check.hosts)} host(s)")
    started = time.monotonic()
    collector = OutputCollector(secret_values(env))
    run, result = run_check(check, env, stop, RunHooks(plan.settings, host), collector)
    if run.stopped_by:
        code = decide_stop_exit_code(run.stopped_by)
        return Outcome(code, f"Stopped by {run.stopped_by} during the deep health check (BYOC_HEALTH_CHECK=deep), "
                             f"before the training started; nothing was trained. Exit code {code}.\n")
    if run.exit_code != 0 or result is None:
        return Outcome(EXIT_BAD_JOB, build_check_crash_text(check, host, run, collector))
    figures = health.build_figures(check, result)
    for figure in figures:
        log(f"{host}: deep health check: {health.describe_figure(figure, check.min_fraction)}")
    failure = health.build_health_failure(check, figures, host)
    log(f"{host}: deep health check: {'FAILED' if failure else 'passed'} in {time.monotonic() - started:.1f} s "
        f"({result.get('device')})")
    return Outcome(EXIT_BAD_JOB, failure, logged=False) if failure else None


def build_check_crash_text(check: health.HealthCheck, host: str, run: RunResult, collector: OutputCollector) -> str:
    tail = "\n".join(f"  {line}" for line in list(collector.tail)[-20:])
    return (f"Deep health check (BYOC_HEALTH_CHECK=deep) failed on {host}, the training never started: its "
            f"all-reduce across {check.ranks_per_host} rank(s) on each of {len(check.hosts)} host(s) "
            f"{run.launch_error or f'ended with exit code {run.exit_code} and no figures'}. With several hosts, "
            f"one host's check failing (or never starting within BYOC_HEALTH_CHECK_TIMEOUT_S) fails the others'; "
            f"its log says why. Unset BYOC_HEALTH_CHECK to skip the check. The check's last lines:\n{tail}\n")
