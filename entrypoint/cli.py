"""`python -m entrypoint train [--dry-run]`: read, decide, then run or print the plan."""

from __future__ import annotations

import errno
import os
import sys
from typing import NamedTuple

from entrypoint import orchestrate
from entrypoint.loop import StacksRequested, StopRequested, Waited
from entrypoint.run import finishing, runtime_dirs
from entrypoint.run.stop import NoRanksToAsk, SayStop, Stop
from entrypoint.job.config import JobConfig, find_missing_channel_dirs, load_job
from entrypoint.job.json_text import build_json
from entrypoint.decide.distribution import parse_distribution
from entrypoint.decide.settings import parse_launch_settings
from entrypoint.settings import LaunchSettings
from entrypoint.errors import EXIT_BAD_JOB, JobDefinitionError
from entrypoint.outcome.failure import describe_bad_definition, redact, secret_values
from entrypoint.outcome.stops import decide_stop_exit_code, describe_startup_stop
from entrypoint.log import log
from entrypoint.outcome.records import Outcome
from entrypoint.outcome.writer import clear_previous_outcome, render_reason, write_outcome
from entrypoint.job.paths import MlPaths, build_paths
from entrypoint.decide.plan import LaunchPlan, Runtime, decide
from entrypoint.job.probe import MachineFacts, probe_machine
from entrypoint.job.program import check_program_name, decide_code_source, fetch_code, inspect_code


class Args(NamedTuple):
    command: str
    dry_run: bool


def parse_args(argv: list[str] | None) -> Args:
    """What SageMaker passes (`train`) and `train --dry-run` are read at once; anything else
    (help, a typo) goes to argparse for its usage and error message (~1.5 ms of imports that
    every start would pay)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "train" and all(a == "--dry-run" for a in argv[1:]):
        return Args("train", len(argv) > 1)
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m entrypoint",
        description="SageMaker training entrypoint: reads /opt/ml (or SAGEMAKER_BASE_DIR), "
        "decides how to launch the training program and runs it.",
    )
    parser.add_argument("command", choices=["train"], help="what SageMaker asks for (`docker run <image> train`)")
    parser.add_argument("--dry-run", action="store_true", help="print the launch plan as JSON and run nothing")
    parsed = parser.parse_args(argv)
    return Args(parsed.command, parsed.dry_run)


def load_runtime(settings: LaunchSettings, job_id: str) -> Runtime:
    return Runtime(python=sys.executable, files=runtime_dirs.load_runtime_files(settings.runtime_dir, job_id))


def decide_job_id_of(job: JobConfig) -> str:
    """A job of one host has nobody to share its folder's path with: its id is this
    entrypoint's own (two runs of one definition on one machine, side by side, never meet).
    Several hosts need the same path on each (runtime_dirs.py), and each has a /run of its own."""
    return runtime_dirs.decide_job_id(job.environ.get("TRAINING_JOB_NAME", ""), job.resource.hosts,
                                      build_json(dict(job.hyperparameters.values), sort_keys=True, default=str),
                                      str(os.getpid()) if len(job.resource.hosts) == 1 else "")


def load_plan(job: JobConfig, facts: MachineFacts, runtime: Runtime, settings: LaunchSettings) -> LaunchPlan:
    """Everything between reading and running: the pure decisions, and a read-only look at the
    code folder (is it empty, what entry point and requirements it holds). settings: the job's
    environment, read once (parse_launch_settings)."""
    dist = parse_distribution(job)
    command_job = job.sdk_v3 is not None and job.sdk_v3.driver == "command"  # SDK v3's command=: no program
    program = "" if command_job else check_program_name(job.program)
    missing = find_missing_channel_dirs(job)
    if missing:
        raise JobDefinitionError(
            f"inputdataconfig.json names the channel(s) {', '.join(missing)}, but "
            f"{', '.join(job.paths.channel_dir(c) for c in missing)} "
            f"{'does' if len(missing) == 1 else 'do'} not exist. In File and FastFile mode "
            f"SageMaker puts each channel's data there before the container starts."
        )
    code_dir = job.paths.code_dir
    code_dir_empty = not (os.path.isdir(code_dir) and os.listdir(code_dir))
    code = decide_code_source(job.hyperparameters.sagemaker.get("sagemaker_submit_directory"), code_dir, code_dir_empty)
    return decide(job, dist, facts, settings, runtime, code, inspect_code(code, code_dir, program), program)


def render_plan(plan: LaunchPlan, environ: dict[str, str], preflight: list | None = None) -> str:
    """The plan as --dry-run prints it; with PREFLIGHT (findings), the pre-flight's verdict too."""
    secrets = secret_values({**environ, **plan.env_dict})
    doc = {
        "role": plan.role,
        "launcher": plan.launcher,
        "current_host": plan.current_host,
        "hosts": list(plan.hosts),
        "leader": plan.leader,
        "network_interface": plan.interface,
        "processes_per_host": plan.processes_per_host,
        "cwd": plan.cwd,
        "code": {"source": plan.code.kind, "uri": plan.code.uri, "entry_point": plan.entry.kind, "program": plan.entry.path},
        "install": [list(step) for step in plan.install],
        "processes": [
            {"name": p.name, "argv": list(p.argv), "env": dict(p.env), **({"cwd": p.cwd} if p.cwd else {})}
            for p in plan.processes
        ],
        "env": plan.env_dict,
        "grace_period_s": plan.settings.grace_period_s,
        "notes": list(plan.notes),
    }
    if preflight is not None:
        doc["preflight"] = [{"fatal": finding.fatal, "text": finding.text} for finding in preflight]
    if plan.health_check is not None:
        check = plan.health_check
        doc["health_check"] = {
            "hosts": list(check.hosts), "backend": check.backend, "ranks_per_host": check.ranks_per_host,
            "mib": check.mib, "instance_type": check.instance_type, "expected_host_gbps": check.expected_host_gbps,
            "expected_job_gbps": check.expected_job_gbps, "min_fraction": check.min_fraction, "source": check.source,
            "processes": [{"name": p.name, "argv": list(p.argv), "env": dict(p.env)} for p in check.processes],
        }
    # Not ASCII-escaped, so a user's text reads as written; a lone surrogate (a hyperparameter's
    # "\ud800") becomes that very JSON escape, so the plan still prints and reads back the same.
    text = build_json(doc, indent=2, ensure_ascii=False).encode("utf-8", "backslashreplace").decode("utf-8")
    return redact(text, secrets)


def build_bad_job(message: str, environ: dict[str, str]) -> Outcome:
    """A bad job definition: its whole paragraph goes to the log now and to output/failure."""
    report = describe_bad_definition(message)
    log(render_reason(report, secret_values(environ)).strip())
    return Outcome(EXIT_BAD_JOB, report, logged=True)


def build_startup_stopped(stop: Stop) -> Outcome:
    """The outcome of a stop that came before the role started (the first stop's)."""
    code = decide_stop_exit_code(stop.loop.stop_signum)
    return Outcome(code, describe_startup_stop(stop.loop.stop_name, code))




def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    environ = dict(os.environ)
    paths = build_paths(environ)
    if environ.get("BYOC_SDK_V3_RUN") == "byoc":  # bash-env.sh handed us SDK v3's sm_train.sh
        why = decide_v3_fallback(environ, paths)
        refused = find_refused_setting(environ) if why else None  # refused here as on our own route
        if why and refused is None:
            return start_v3_drivers(environ, why, args.dry_run)
    else:
        refused = None
    if args.dry_run and refused is not None:
        log(render_reason(describe_bad_definition(refused), secret_values(environ)).strip())
        return EXIT_BAD_JOB
    if args.dry_run:
        return print_plan(environ, paths)
    stop = Stop()  # the job's one stop token: every wait and every role reads it (run/stop.py)
    launch = orchestrate.Launch(stop, tuple(secret_values(environ)))
    try:
        # Installed inside the try: a stop from the first moment it is ours ends in an outcome.
        # Every handler only posts; start-up looks at the loop between its steps.
        stop.loop.on({StopRequested: SayStop(stop.loop, " during start-up"), StacksRequested: NoRanksToAsk()})
        stop.install()
        clear_previous_outcome(paths)
        outcome = build_bad_job(refused, environ) if refused is not None else run(environ, paths, launch)
    except BaseException:
        launch.close(Outcome(1))  # an error of ours (its traceback follows): no other host waits on
        raise
    finish = finishing.start_finish(stop)  # from here a stop keeps this outcome and ends the rest
    try:
        write_outcome(paths, outcome, launch.secrets)  # the one place output/ is written
    finally:
        # output/data/report (the leader's; a worker sends its figures), then closing (an MPI
        # leader tells its workers what it wrote), each bounded: run/finishing.py.
        finishing.run_finish(finish, launch, outcome)
    return outcome.exit_code


def find_refused_setting(environ: dict[str, str]) -> str | None:
    """Why a BYOC_* setting of the environment is refused (the table's reading), or None."""
    try:
        parse_launch_settings(environ)
    except JobDefinitionError as exc:
        return str(exc)
    return None


def decide_v3_fallback(environ: dict[str, str], paths: MlPaths) -> str | None:
    """Why SDK v3's own drivers should run this v3 job (job/v3_definition.py), or None: ours."""
    from entrypoint.job import v3_definition as v3

    if v3.decide_v3_route(environ) == v3.SDK:
        return f"{v3.CHOICE_ENV}={environ.get(v3.CHOICE_ENV)}"
    try:
        job = v3.load_handed_v3_job(paths, environ)
        if job is not None:
            from entrypoint.decide.distribution import parse_v3_mpi_options

            # mpirun options we refuse: v3's own mpirun takes them. What no launcher can run (a
            # count that is not one, a -np the plan does not start) the plan refuses instead.
            parse_v3_mpi_options(job)
    except (v3.V3NotUnderstood, JobDefinitionError) as exc:
        return str(exc)
    return None


def start_v3_drivers(environ: dict[str, str], why: str, dry_run: bool) -> int:
    """Give the job back to v3's own drivers: the `bash -c` command v3 gave PID 1, run again
    with BYOC_SDK_V3_RUN=sdk (bash-env.sh then prepares for v3's drivers, as before)."""
    from entrypoint.job import v3_definition as v3

    command = environ.get(v3.COMMAND_ENV) or v3.DEFAULT_COMMAND
    argv = ["/bin/bash", "-c", command]
    log(f"SDK v3's own drivers run this job: {why}")
    if dry_run:
        print(build_json({"sdk_v3_drivers": why, "argv": argv}, indent=2))
        return 0
    env = {**environ, v3.RUN_ENV: v3.SDK}
    env.pop(v3.COMMAND_ENV, None)
    os.execve(argv[0], argv, env)
    return 127  # not reached


def print_plan(environ: dict[str, str], paths: MlPaths) -> int:
    """--dry-run: the plan as JSON on stdout; nothing is written, nothing runs."""
    try:
        job, facts, _runtime, plan = load_job_and_plan(environ, paths)
    except JobDefinitionError as exc:
        log(render_reason(describe_bad_definition(str(exc)), secret_values(environ)).strip())
        return EXIT_BAD_JOB
    for note in plan.notes:
        log(f"note: {note}")
    # The pre-flight's verdict as a job on this machine would get it (its probes only read).
    print(render_plan(plan, environ, load_preflight_findings(job, facts, plan, paths)))
    return 0


def load_job_and_plan(environ: dict[str, str], paths: MlPaths):
    job = load_job(paths, environ)
    settings = parse_launch_settings(job.environ)  # first: every setting refused before anything starts
    runtime = load_runtime(settings, decide_job_id_of(job))
    facts = probe_machine()
    return job, facts, runtime, load_plan(job, facts, runtime, settings)


def run(environ: dict[str, str], paths: MlPaths, launch: orchestrate.Launch) -> Outcome:
    """Read, decide, fetch the code (and decide again), pre-flight (beside the loop: a stop walks
    away from a read or a fetch that blocks), make the job's folders, run: the job's outcome,
    whichever step ended it."""
    stop = launch.stop
    waited, prepared = stop.loop.run_beside(prepare_job, environ, paths)
    if waited is not Waited.DONE:
        return build_startup_stopped(stop)
    if isinstance(prepared, Outcome):
        return prepared
    plan, runtime, launch.secrets, outcome = prepared  # secrets: what the outcome's words mask
    if outcome is not None:
        return outcome
    launch.folders = tuple(runtime.files.folders)
    outcome = start_job_folders(launch.folders)
    stop.loop.handle_pending()
    if outcome is None and stop.loop.stopped():
        outcome = build_startup_stopped(stop)
    if outcome is not None:
        return outcome
    try:
        # Where the job's files for output.tar.gz go, and NCCL's flight recorder its dumps
        # (gpu_env.py): SageMaker makes it; a bare local tree may not have it.
        os.makedirs(paths.output_data_dir, exist_ok=True)
    except OSError:
        pass  # a read-only output folder: the job still runs (outcome/writer.py says so at the end)
    return orchestrate.run_plan(plan, paths, environ, launch)


class Prepared(NamedTuple):
    plan: LaunchPlan
    runtime: Runtime
    secrets: tuple[str, ...]  # the environment's and the plan's
    outcome: Outcome | None  # the pre-flight's, when it ended the job


def prepare_job(environ: dict[str, str], paths: MlPaths) -> Prepared | Outcome:
    """The plan and what it needs, or the Outcome of a bad job definition. Beside the loop: it
    touches nothing the main thread owns."""
    try:
        job, facts, runtime, plan = load_job_and_plan(environ, paths)
    except JobDefinitionError as exc:
        return build_bad_job(str(exc), environ)
    for note in plan.notes:
        log(f"note: {note}")
    if plan.code.kind != "code_dir":
        plan = fetch_code_and_decide_again(job, facts, runtime, plan, paths, environ)
        if isinstance(plan, Outcome):
            return plan
    secrets = tuple(secret_values({**environ, **plan.env_dict}))
    return Prepared(plan, runtime, secrets, run_preflight(job, facts, plan, paths))


def fetch_code_and_decide_again(job: JobConfig, facts: MachineFacts, runtime: Runtime, plan: LaunchPlan,
                                paths: MlPaths, environ: dict[str, str]) -> LaunchPlan | Outcome:
    """sagemaker_submit_directory: fetch the code, then decide again (only the fetched folder
    tells the entry point's kind)."""
    log(f"fetching the source directory from {plan.code.uri}")
    try:
        fetch_code(plan.code, paths.code_dir)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):  # else: a bad archive or address, reported below
            return build_bad_job(f"could not fetch sagemaker_submit_directory {plan.code.uri}: {exc}", environ)
        from entrypoint.job.archive import NoRoomError  # imported already: fetch_code unpacks with it

        # A full disk: the definition is fine. NoRoomError says how much was needed and free.
        text = exc.strerror if isinstance(exc, NoRoomError) else (
            f"no room to fetch sagemaker_submit_directory {plan.code.uri} into {paths.code_dir}: {exc}")
        return Outcome(EXIT_BAD_JOB, f"The training never started: {text}\n")
    except Exception as exc:  # noqa: BLE001 - reported in output/failure, not as a traceback
        return build_bad_job(f"could not fetch sagemaker_submit_directory {plan.code.uri}: {exc}", environ)
    try:
        return load_plan(job, facts, runtime, plan.settings)  # now the code folder tells the entry point's kind
    except JobDefinitionError as exc:
        return build_bad_job(str(exc), environ)


def start_job_folders(folders: tuple[str, ...]) -> Outcome | None:
    """The job's runtime folders (runtime_dirs.py); an Outcome when one cannot be made."""
    try:
        for folder in folders:
            runtime_dirs.start_job_folder(folder)
    except (runtime_dirs.RuntimeDirError, OSError) as exc:
        text = str(exc) if isinstance(exc, runtime_dirs.RuntimeDirError) else f"cannot make the job's runtime folder: {exc}"
        return Outcome(EXIT_BAD_JOB, f"The training never started: {text}\n")
    return None


def run_preflight(job: JobConfig, facts: MachineFacts, plan: LaunchPlan, paths: MlPaths) -> Outcome | None:
    """The machine checks of entrypoint/decide/preflight.py; a fatal finding ends the job before it
    starts (exit EXIT_BAD_JOB: the script never ran), with every finding in output/failure."""
    import time

    started = time.monotonic()
    found = load_preflight_findings(job, facts, plan, paths)
    for finding in found:
        log(f"pre-flight {'FAILED' if finding.fatal else 'warning'}: {finding.text}")
    fatal = [f.text for f in found if f.fatal]
    log(f"pre-flight: {len(fatal)} fatal, {len(found) - len(fatal)} warning(s), "
        f"{(time.monotonic() - started) * 1000:.1f} ms")
    if not fatal:
        return None
    return Outcome(EXIT_BAD_JOB, "Pre-flight check failed, the training never started: " + " ".join(fatal) + "\n",
                   logged=True)


def load_preflight_findings(job: JobConfig, facts: MachineFacts, plan: LaunchPlan, paths: MlPaths) -> list:
    """What entrypoint/decide/preflight.py finds on this machine for this plan (its probes only read)."""
    from entrypoint.decide import preflight

    # The folders whose lack of room costs the run: the model (written at the end) and
    # checkpoints; and output/ (output/failure, output/data), which only warns.
    folders = [paths.model_dir, paths.output_dir] + ([job.checkpoint.local_path] if job.checkpoint else [])
    found = preflight.decide_preflight(preflight.probe_preflight_facts(
        plan.current_host, job.resource.current_instance_type, folders, facts.gpu_count, facts.neuron_core_count,
        facts.efa, plan.processes_per_host, output_dir=paths.output_dir)._replace(
        host_count=len(plan.hosts), efa_devices=facts.efa_devices, efa_uverbs=facts.efa_uverbs,
        libfabric=facts.libfabric, ofi_nccl_plugin=facts.ofi_nccl_plugin, build_versions=facts.build_versions,
        job_settings=tuple((k, job.environ[k]) for k in preflight.EFA_JOB_SETTINGS if k in job.environ)))
    return found
