"""Development runners: the README's main job (run_main_job, main_job) and a parameter-server
job on one machine (ps_local). They drive emulated hosts and SageMaker local mode from a
checkout; no image ships them (the Dockerfiles copy entrypoint/ and train/ only)."""
