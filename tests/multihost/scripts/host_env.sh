#!/bin/sh
# A shell-script rank under mpirun: what it sees of its host (tests/multihost/test_jobs.py).
echo "$SM_CURRENT_HOST $(hostname)" > "$SM_MODEL_DIR/shell-rank-$OMPI_COMM_WORLD_RANK"
