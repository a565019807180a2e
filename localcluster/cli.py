"""`python -m localcluster`: smoke-test a SageMaker training job on emulated hosts.

    python -m localcluster run --hosts 2 --code src --program train.py --hp epochs=1 \\
        --distribution torch_distributed
    python -m localcluster run --hosts 2 -- python3 -c 'import socket; print(socket.gethostname())'
    python -m localcluster cleanup     # remove clusters left by a killed localcluster
    python -m localcluster list
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

from localcluster import registry, rootless
from localcluster.cluster import EmulatedCluster
from localcluster.teardown import remove_stale_clusters
from localcluster.errors import ClusterError
from localcluster.optml import (
    DISTRIBUTIONS,
    JobSpec,
    parse_assignment,
    parse_channel_assignments,
    parse_hyperparameter_assignments,
    parse_hyperparameters_json,
    parse_instance_groups_spec,
)
from localcluster.outcome import ClusterResult, build_summary
from localcluster.plan import build_default_host_names, parse_host_names
from localcluster.requirements import ROOT_MESSAGE, probe_requirements, probe_user_namespaces

EXIT_FAILED = 1
EXIT_USAGE = 2


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass(frozen=True)
class RunConfig:
    hosts: tuple[str, ...]
    job: JobSpec
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    keep: bool = False
    timeout: float | None = None
    grace: float = 10.0
    fail_fast: bool = True
    ssh_seed: str | None = None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m localcluster",
        description="Emulate a multi-host SageMaker training cluster on this machine (namespaces, no Docker).",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser(
        "run",
        help="bring up hosts, run the job on every host, report, tear down",
        description="Bring up emulated hosts algo-1..N, lay out /opt/ml on each as SageMaker local mode "
        "does, run the container command on every host at once (default: <this python> -m entrypoint "
        "train), stream output as `[algo-1] ...`, print a summary and tear everything down.",
    )
    hosts = run.add_mutually_exclusive_group()
    hosts.add_argument("--hosts", type=int, default=2, metavar="N", help="hosts algo-1..algo-N (default 2)")
    hosts.add_argument("--host-names", metavar="A,B,...", help="explicit host names, in creation order")
    run.add_argument("--code", metavar="DIR", help="source folder, mounted at /opt/ml/code on every host")
    run.add_argument("--program", metavar="FILE", help="entry script (sagemaker_program)")
    run.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE",
                     help="a hyperparameter; VALUE is read as JSON when it parses (3, true, [1,2]), else as a string")  # fmt: skip
    run.add_argument("--hyperparameters-json", metavar="FILE", help="a JSON object of hyperparameters (--hp wins)")
    run.add_argument("--channel", action="append", default=[], metavar="NAME=DIR",
                     help="an input channel, mounted at /opt/ml/input/data/NAME on every host")  # fmt: skip
    run.add_argument("--distribution", choices=DISTRIBUTIONS, default="none",
                     help="the hyperparameters an SDK estimator writes for distribution=")  # fmt: skip
    run.add_argument("--processes-per-host", type=int, metavar="P", help="sagemaker_mpi_num_of_processes_per_host (mpi)")
    run.add_argument("--custom-mpi-options", default="", metavar="OPTS", help="sagemaker_mpi_custom_mpi_options (mpi)")
    run.add_argument("--instance-groups", metavar="SPEC",
                     help="heterogeneous cluster: NAME:COUNT[:TYPE],... hosts handed out in order, e.g. train:2,data:1")  # fmt: skip
    run.add_argument("--distribution-instance-groups", metavar="A,B", help="sagemaker_distribution_instance_groups")
    run.add_argument("--job-name", default="localcluster-job", help="TRAINING_JOB_NAME and sagemaker_job_name")
    run.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="add to every host's environment")
    run.add_argument("--workdir", metavar="DIR", help="put the hosts' files here and keep them (default: a temp folder)")
    run.add_argument("--keep", action="store_true", help="keep the temp folder (hosts' /opt/ml, model, logs)")
    run.add_argument("--timeout", type=float, metavar="SECONDS", help="stop the job after this long (MaxRuntimeInSeconds)")
    run.add_argument("--stop-timeout", type=float, default=10.0, metavar="SECONDS",
                     help="between SIGTERM and SIGKILL when the job is stopped (default 10)")  # fmt: skip
    run.add_argument("--no-fail-fast", action="store_true",
                     help="keep the other hosts running when one fails (default: stop them, as SageMaker does)")  # fmt: skip
    run.add_argument("--ssh-seed", metavar="DIR", help="copy this folder into every host's private /root/.ssh")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ...: run this on every host instead")
    bench = sub.add_parser("bench", help="time bringing hosts up and tearing them down")
    bench.add_argument("--hosts", type=int, default=2, metavar="N")
    bench.add_argument("--repeat", type=int, default=10, metavar="K")
    sub.add_parser("cleanup", help="remove clusters whose localcluster process died")
    sub.add_parser("list", help="list the clusters that exist on this machine")
    return parser


def build_run_config(args: argparse.Namespace, hyperparameters_file_text: str | None, python: str) -> RunConfig:
    """Turn parsed arguments into what will run (pure; ValueError for bad input)."""
    host_names = parse_host_names(args.host_names) if args.host_names else build_default_host_names(args.hosts)
    hyperparameters = {}
    if hyperparameters_file_text is not None:
        hyperparameters.update(parse_hyperparameters_json(hyperparameters_file_text, args.hyperparameters_json))
    hyperparameters.update(parse_hyperparameter_assignments(args.hp))
    channels = tuple(
        replace(c, source=os.path.abspath(c.source)) for c in parse_channel_assignments(args.channel)
    )
    job = JobSpec(
        job_name=args.job_name,
        hyperparameters=hyperparameters,
        program=args.program,
        code_dir=os.path.abspath(args.code) if args.code else None,
        channels=channels,
        distribution=args.distribution,
        processes_per_host=args.processes_per_host,
        custom_mpi_options=args.custom_mpi_options,
        instance_groups=parse_instance_groups_spec(args.instance_groups) if args.instance_groups else (),
        distribution_instance_groups=tuple(
            g.strip() for g in (args.distribution_instance_groups or "").split(",") if g.strip()
        ),
    )
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        # What SageMaker runs: the image's ENTRYPOINT with `train`.
        command = [python, "-m", "entrypoint", "train"]
    env = dict(parse_assignment(item, "--env") for item in args.env)
    if args.timeout is not None and args.timeout <= 0:
        raise ValueError("--timeout must be positive")
    return RunConfig(
        hosts=host_names,
        job=job,
        command=tuple(command),
        env=env,
        workdir=os.path.abspath(args.workdir) if args.workdir else None,
        keep=args.keep,
        timeout=args.timeout,
        grace=args.stop_timeout,
        fail_fast=not args.no_fail_fast,
        ssh_seed=os.path.abspath(args.ssh_seed) if args.ssh_seed else None,
    )


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def _say(text: str) -> None:
    print(f"localcluster: {text}", flush=True)


def load_failure_files(cluster: EmulatedCluster) -> dict[str, str]:
    found = {}
    for host in cluster.host_names:
        path = os.path.join(cluster.opt_ml(host), "output", "failure")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                found[host] = f.read()
        except OSError:
            pass
    return found


def run_job(config: RunConfig) -> int:
    signal.signal(signal.SIGINT, _raise_interrupted)
    signal.signal(signal.SIGTERM, _raise_interrupted)
    interrupted: Interrupted | None = None
    result: ClusterResult | None = None
    cluster = EmulatedCluster(
        config.hosts, config.job, workdir=config.workdir, keep=config.keep, echo=sys.stdout, ssh_seed=config.ssh_seed
    )
    run = None
    try:
        cluster.start()
        plan = cluster.plan
        _say(
            f"cluster {plan.cluster_id} up: "
            + ", ".join(f"{h.name}={h.address}" for h in plan.hosts)
            + f" (bridge {plan.bridge}, files in {cluster.workdir})"
        )
        run = cluster.start_all(list(config.command), env=config.env, stop_host_on_exit=True)
        _say("started on every host: " + shlex.join(config.command))
        result = run.wait(timeout=config.timeout, fail_fast=config.fail_fast, grace=config.grace)
    except Interrupted as e:
        interrupted = e
        if run is None:
            _say(f"{e} before the job started")
        else:
            _say(f"{e}: stopping the job (SIGTERM to every host, SIGKILL after {config.grace:g} s; again to kill now)")
            try:
                result = run.stop(f"interrupted by {e}", grace=config.grace)
            except Interrupted:
                result = run.stop(f"interrupted by {e}", grace=0)
    finally:
        # Teardown must finish: another Ctrl-C now would only leave pieces behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            if result is not None:
                print(build_summary(result, load_failure_files(cluster)), flush=True)
            cluster.stop()
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if cluster.keep:
        _say(f"kept {cluster.workdir} (per-host /opt/ml under hosts/, model under shared/model, logs under logs/)")
    _say("torn down")
    if interrupted is not None:
        return 128 + interrupted.signum
    return 0 if result is not None and result.ok else EXIT_FAILED


def run_bench(hosts: int, repeat: int) -> int:
    ups, downs = [], []
    for _ in range(repeat):
        cluster = EmulatedCluster(build_default_host_names(hosts))
        t0 = time.perf_counter()
        cluster.start()
        t1 = time.perf_counter()
        cluster.stop()
        ups.append(t1 - t0)
        downs.append(time.perf_counter() - t1)
    for what, times in (("up", ups), ("down", downs)):
        _say(
            f"{hosts} hosts {what}: median {statistics.median(times) * 1000:.0f} ms, "
            f"min {min(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms ({repeat} runs)"
        )
    return 0


def list_clusters() -> int:
    records = registry.load_records()
    if not records:
        _say("no clusters")
    for r in records:
        alive = registry.is_alive(r["owner_pid"], r.get("owner_start"))
        state = f"owner pid {r['owner_pid']}" + ("" if alive else " (dead: `cleanup` removes it)")
        print(f"{r['id']}  {r['subnet']}  {len(r['netns'])} hosts  {state}  {r['workdir']}")
    return 0


def cleanup_clusters() -> int:
    with registry.registry_lock():
        removed = remove_stale_clusters()
    _say(f"removed {len(removed)} cluster(s) whose owner died" + (f": {', '.join(removed)}" if removed else ""))
    return 0


def reexec_in_user_namespace(cli_args: list[str]) -> int:
    """Not root: run this same command again inside a user namespace that maps us to root."""
    problem = probe_user_namespaces()
    if problem is not None:
        print(f"localcluster: error: {ROOT_MESSAGE}\nlocalcluster: (user namespace: {problem})", file=sys.stderr)
        return EXIT_USAGE
    _say("not root: running inside a user namespace (unshare --user --map-root-user); sshd cannot run there")
    env = dict(os.environ, **{rootless.MARKER: "1"})
    argv = rootless.build_reexec_argv(sys.executable, cli_args)
    os.execvpe(argv[0], argv, env)
    return EXIT_USAGE  # not reached: exec replaces this process


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    cli_args = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(cli_args)
    if os.geteuid() != 0 and os.environ.get(rootless.MARKER) is None:
        return reexec_in_user_namespace(cli_args)
    try:
        if os.environ.get(rootless.MARKER) is not None:
            rootless.prepare_user_namespace()
        probe_requirements()
        if args.action == "list":
            return list_clusters()
        if args.action == "cleanup":
            return cleanup_clusters()
        if args.action == "bench":
            return run_bench(args.hosts, args.repeat)
        text = None
        if args.hyperparameters_json:
            with open(args.hyperparameters_json, encoding="utf-8") as f:
                text = f.read()
        config = build_run_config(args, text, sys.executable)
        return run_job(config)
    except (ClusterError, ValueError, OSError) as e:
        print(f"localcluster: error: {e}", file=sys.stderr)
        return EXIT_USAGE
