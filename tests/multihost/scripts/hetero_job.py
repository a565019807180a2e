"""Heterogeneous cluster: hosts of the distribution group run the MPI job; the others note
their group and exit cleanly (the script decides, as with the toolkit)."""
import json
import os
import runpy

groups = json.loads(os.environ["SM_DISTRIBUTION_INSTANCE_GROUPS"])
group = os.environ["SM_CURRENT_INSTANCE_GROUP"]
if group in groups:
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_job.py"), run_name="__main__")
else:
    with open(os.path.join(os.environ["SM_MODEL_DIR"], f"outside-{os.environ['SM_CURRENT_HOST']}"), "w") as f:
        f.write(group)
