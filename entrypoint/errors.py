"""Errors the entrypoint reports to the user (in output/failure) rather than as a traceback."""


class JobDefinitionError(Exception):
    """The job as configured cannot run: bad JSON, wrong types, contradictory keys, a missing
    program. The message is one self-contained paragraph: it names the file or key at fault and
    says what would fix it. Reported in output/failure; the process exits with EXIT_BAD_JOB."""


# Distinct from the user script's own codes so a log reader can tell "we never started the
# script" from "the script failed". SageMaker itself only looks at zero / non-zero.
EXIT_BAD_JOB = 2
