"""The job's report from every host's figures (pure): report.json's content and the summary
table the leader logs. Schema: docs/job-report.md."""

from __future__ import annotations

import statistics

from entrypoint.jobreport.figures import adjust_ddp_ranks, merge_attempts
from entrypoint.jobreport.stragglers import decide_stragglers

VERSION = 1


def build_missing_host(host: str) -> dict:
    return {"status": "missing", "interval_s": None, "cores": None, "sampler_cpu_s": None, "samples_per_s": None,
            "series": {}}


def build_restarts(restarts: list[dict]) -> list[dict]:
    """The failed attempts the job was restarted after (orchestrate.note_restart), each with the
    launcher's part of its cost: from the failure (its first root cause, or its processes'
    end) to the next attempt's processes started (None when none started)."""
    built = []
    for r in restarts:
        cost = r["next_started"] - r["failed"] if r.get("next_started") is not None else None
        built.append({"attempt": r["attempt"], "exit_code": r["exit_code"], "cause": r["cause"], "failed": r["failed"],
                      "next_started": r.get("next_started"), "restart_s": round(cost, 3) if cost is not None else None})
    return built


def build_failure_costs(restarts: list[dict], attempts: list[dict], step_ms: float | None) -> list[dict]:
    """Each restart (build_restarts) with what the failure cost the training, from the ranks'
    figures of the attempt that failed and the next (merge_attempts): `to_first_step_s`, the
    failure to the next attempt's first step; `steps_redone`, the furthest step the failed
    attempt was seen at less the step the next resumed from (a floor: a rank's figures are
    written every few seconds, rank/step_figures.WRITE_EVERY_S); `lost_s`, the training time
    the failure took: from when the step the next attempt resumed from was done (the failed
    attempt's last figures, less or plus the steps between, at the job's step time) to the
    next attempt's first step (never later than the failure: lost_s is at least to_first_step_s),
    so a stall before the failure (a hang) counts too. None where the figures do not tell (no
    step after it; a script that did not say where it resumed)."""
    by_attempt = {a["attempt"]: a for a in attempts}
    costed = []
    for r in restarts:
        failed, after = by_attempt.get(r["attempt"], {}), by_attempt.get(r["attempt"] + 1, {})
        first, seen_at = after.get("first_step_at"), failed.get("last_step_at")
        to_first = round(first - r["failed"], 3) if first is not None and first >= r["failed"] else None
        redone = lost = None
        reached, resumed = failed.get("reached"), after.get("resumed_step")
        if reached is not None and resumed is not None:
            redone = max(0, int(reached - resumed))
            if to_first is not None and seen_at is not None and step_ms:
                # The resumed step was done no later than the failure: a surviving rank's last
                # step may be seen just after it (the allreduce it finished with the rank that
                # died), and the steps between may have been slower than the job's median step.
                resumed_done_at = min(seen_at - (reached - resumed) * step_ms / 1e3, r["failed"])
                lost = round(max(0.0, first - resumed_done_at), 3)
        costed.append({**r, "to_first_step_s": to_first, "steps_redone": redone, "lost_s": lost})
    return costed


def build_efficiency(restarts: list[dict], attempts: list[dict]) -> tuple[float | None, float | None]:
    """The training's wall time (its first step to its last, over every attempt) and the share
    of it that failures did not take (1 less their lost_s over it); None where the figures do
    not tell: no step seen, or a failure whose cost is unknown."""
    firsts = [a["first_step_at"] for a in attempts if a.get("first_step_at") is not None]
    lasts = [a["last_step_at"] for a in attempts if a.get("last_step_at") is not None]
    if not firsts or not lasts or max(lasts) <= min(firsts):
        return None, None
    wall = max(lasts) - min(firsts)
    if any(r["lost_s"] is None for r in restarts):
        return round(wall, 3), None
    lost = sum(r["lost_s"] for r in restarts)
    return round(wall, 3), round(min(1.0, max(0.0, 1.0 - lost / wall)), 4)


def build_report(what: str, leader: str, hosts: tuple[str, ...], exit_code: int, figures: dict[str, dict],
                 notes: list[str], restarts: list[dict] = ()) -> dict:
    """figures: host -> its figures (figures.build_host_figures); a host of `hosts` without any
    is reported missing, and a note says so. restarts: the leader's failed attempts that were
    started again (build_restarts)."""
    notes = list(notes)
    report_hosts, phases, ranks = {}, [], []
    for host in hosts:
        got = figures.get(host)
        if got is None:
            report_hosts[host] = build_missing_host(host)
            notes.append(f"host {host}'s figures did not reach the leader: its part is not in this report")
            continue
        report_hosts[host] = {k: got.get(k) for k in ("status", "interval_s", "cores", "sampler_cpu_s", "samples_per_s",
                                                      "series")}
        phases.extend(got.get("phases") or [])
        ranks.extend(got.get("ranks") or [])
        if got.get("note"):
            notes.append(f"host {host}: {got['note']}")
    ranks = adjust_ddp_ranks(ranks)
    ranks.sort(key=lambda r: (r["rank"] if isinstance(r.get("rank"), int) else 1 << 30, str(r.get("host"))))
    if not ranks:
        notes.append("no PyTorch optimizer step was seen (not a PyTorch program, or it ended before its first "
                     "step): the report has the hosts' figures only")
    times = [p["time"] for p in phases]
    attempts = merge_attempts([(figures.get(h) or {}).get("attempts") or [] for h in hosts])
    step_ms = [r["step_ms"] for r in ranks if isinstance(r.get("step_ms"), (int, float)) and r["step_ms"] > 0]
    restarts = build_failure_costs(build_restarts(list(restarts)), attempts,
                                   statistics.median(step_ms) if step_ms else None)
    training_s, efficiency = build_efficiency(restarts, attempts)
    if any((figures.get(h) or {}).get("local_restarts") for h in hosts):
        efficiency = None  # their failures' times are not in the report: no made-up share
        notes.append("torchrun restarted ranks itself (--max_restarts, one host): those restarts are in the log "
                     "only, and the job's efficiency is not given")
    return {"version": VERSION,
            "job": {"what": what, "leader": leader, "hosts": list(hosts), "exit_code": exit_code,
                    "started": min(times) if times else None, "ended": max(times) if times else None,
                    "framework": "pytorch" if ranks else "none", "attempts": len(restarts) + 1,
                    "restarts_s": round(sum(r["restart_s"] or 0.0 for r in restarts), 3),
                    "training_s": training_s, "efficiency": efficiency,
                    "lost_s": round(sum(r["lost_s"] or 0.0 for r in restarts), 3)},
            "restarts": restarts, "attempts": attempts,
            "phases": sorted(phases, key=lambda p: p["time"]), "hosts": report_hosts, "ranks": ranks,
            "stragglers": decide_stragglers(ranks), "notes": notes}


def _cell(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _mean(values) -> float | None:
    values = [v for v in values or () if isinstance(v, (int, float))]
    return statistics.fmean(values) if values else None


def build_summary_lines(report: dict, max_ranks: int = 16) -> list[str]:
    """The table at the end of the leader's log: a line a host, a line a rank (the first
    max_ranks and every straggler), then the stragglers named."""
    lines = ["job report: host      cpu%  tree cpu%  tree MB  net MB/s in/out  sampler cpu s"]
    for host, h in report["hosts"].items():
        s = h.get("series") or {}
        if h.get("status") != "reported":
            lines.append(f"job report: {host:<9} (figures missing)")
            continue
        rss = [v for v in s.get("tree_rss_mb") or () if v is not None]
        lines.append(f"job report: {host:<9} {_cell(_mean(s.get('cpu_pct'))):>5} {_cell(_mean(s.get('tree_cpu_pct'))):>10} "
                     f"{_cell(max(rss) if rss else None):>8} {_cell(_mean(s.get('net_rx_mbps')), 2):>8}/"
                     f"{_cell(_mean(s.get('net_tx_mbps')), 2):<7} {_cell(h.get('sampler_cpu_s'), 2):>13}")
    for host, h in report["hosts"].items():
        if h.get("samples_per_s") is not None:
            lines.append(f"job report: {host}: the script's own output reports {h['samples_per_s']:,.1f} samples/s "
                         f"(median)")
    slow = {(s.get("rank"), s["host"]) for s in report["stragglers"] if s["kind"] == "rank"}
    shown = [r for i, r in enumerate(report["ranks"]) if i < max_ranks or (r["rank"], r["host"]) in slow]
    if shown:
        lines.append("job report: rank host       steps  step ms  compute ms  wait ms  (compute: how measured)")
    for r in shown:
        lines.append(f"job report: {str(r['rank']):>4} {r['host']:<9} {r['steps']:>6} {_cell(r['step_ms']):>8} "
                     f"{_cell(r['compute_ms']):>11} {_cell(r['wait_ms']):>8}  ({r['compute_source']})")
    if len(shown) < len(report["ranks"]):
        lines.append(f"job report: ... {len(report['ranks']) - len(shown)} more rank(s) in report.json")
    for s in report["stragglers"]:
        lines.append(f"job report: straggler: {s['line']}")
    if not report["stragglers"] and report["ranks"]:
        lines.append("job report: no rank or host stood out (docs/job-report.md: the rule)")
    for r in report.get("restarts") or ():
        after = f"attempt {r['attempt'] + 1} started {r['restart_s']:.1f} s later" if r["restart_s"] is not None \
            else f"no attempt {r['attempt'] + 1} started"
        cost = "" if r.get("lost_s") is None else (
            f"; {r['lost_s']:.1f} s lost ({r['to_first_step_s']:.1f} s to the next first step"
            + (f", at least {r['steps_redone']} step(s) redone" if r.get("steps_redone") is not None else "") + ")")
        lines.append(f"job report: restart: attempt {r['attempt']} failed (exit code {r['exit_code']}: {r['cause']}); "
                     f"{after}{cost}")
    job = report.get("job") or {}
    if report.get("restarts") and job.get("efficiency") is not None:
        lines.append(f"job report: efficiency {job['efficiency']:.3f}: {job['lost_s']:.1f} s of "
                     f"{job['training_s']:.1f} s of training lost to {len(report['restarts'])} failure(s)")
    return lines
