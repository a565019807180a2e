"""The environment a command on an emulated host starts with (pure).

Like a container, a host does not inherit the caller's environment: it gets what an image's
ENV would give (PATH with the Python environment's bin folder first, LANG, unbuffered
Python), what SageMaker passes (TRAINING_JOB_NAME, AWS_REGION when set), HOSTNAME, and
whatever the caller adds explicitly.
"""

from __future__ import annotations

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def build_job_environment(
    host: str,
    python_bin_dir: str,
    job_name: str,
    region: str | None = None,
    additions: dict[str, str] | None = None,
    home: str = "/root",
) -> dict[str, str]:
    env = {
        "PATH": f"{python_bin_dir}:{SYSTEM_PATH}",
        "HOME": home,
        "LANG": "C.UTF-8",
        "HOSTNAME": host,
        # Output goes through a pipe: unbuffered, so that lines stream as they are printed.
        "PYTHONUNBUFFERED": "1",
        "TRAINING_JOB_NAME": job_name,
    }
    if region is not None:
        env["AWS_REGION"] = region
    for key, value in (additions or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"environment additions must be str -> str, got {key!r}: {value!r}")
        env[key] = value
    return env
