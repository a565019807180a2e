"""JobConfig values built in memory, for the pure decision code (no files, no patches)."""

from __future__ import annotations

from entrypoint.job.config import (
    JobConfig,
    frozen_mapping,
    parse_hyperparameters,
    parse_input_data_config,
    parse_program,
    parse_resource_config,
)
from entrypoint.decide.distribution import parse_distribution
from entrypoint.decide.settings import parse_launch_settings
from entrypoint.job.paths import MlPaths
from entrypoint.decide.plan import Runtime, decide
from entrypoint.job.probe import MachineFacts
from entrypoint.job.program import CodeFacts, CodeSource
from entrypoint.decide.specs import RuntimeFiles

PY = "/usr/bin/python3"
RUNTIME = Runtime(python=PY, files=RuntimeFiles("/tmp/byoc"))
PATHS = MlPaths("/opt/ml")
CPU = MachineFacts(cpu_count=8, gpu_count=0, neuron_core_count=0, efa=False, interfaces=("eth0", "lo"))
GPU8_EFA = MachineFacts(cpu_count=96, gpu_count=8, neuron_core_count=0, efa=True, interfaces=("eth0", "lo"))
GPU4 = MachineFacts(cpu_count=48, gpu_count=4, neuron_core_count=0, efa=False, interfaces=("eth0", "lo"))
TRN1_EFA = MachineFacts(cpu_count=128, gpu_count=0, neuron_core_count=32, efa=True, interfaces=("eth0", "lo"))
SCRIPT = CodeFacts(known=True, program_exists=True)


def make_job(hosts=("algo-1",), current="algo-1", hps=None, resource_extra=None, environ=None, channels=None,
             checkpoint=None) -> JobConfig:
    resource = parse_resource_config({"current_host": current, "hosts": list(hosts), **(resource_extra or {})})
    hyperparameters = parse_hyperparameters({"sagemaker_program": '"train.py"', **{k: _enc(v) for k, v in (hps or {}).items()}})
    environ = dict(environ or {})
    program, from_env = parse_program(hyperparameters, environ)
    return JobConfig(
        paths=PATHS,
        resource=resource,
        hyperparameters=hyperparameters,
        input_data=parse_input_data_config(channels or {}),
        checkpoint=checkpoint,
        program=program,
        program_from_env=from_env,
        environ=frozen_mapping(environ),
    )


def _enc(value):
    import json

    return json.dumps(value)


def plan_for(job: JobConfig, facts: MachineFacts = CPU, code_facts: CodeFacts = SCRIPT):
    return decide(
        job,
        parse_distribution(job),
        facts,
        parse_launch_settings(job.environ),
        RUNTIME,
        CodeSource("code_dir", None),
        code_facts,
        job.program,
    )
