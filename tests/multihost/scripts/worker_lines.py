"""Issue 33, case 6, across hosts: the rank on the worker host prints text shaped like mpirun's
tag mid-line, on both streams, a burst of short lines in one write, and a long line of 2-byte
characters; the leader's log must hold every line whole."""
import os
import sys

rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
for i in range(200):
    print(f"rank {rank} i={i} says [1,0]<stdout>: mid-line [1,1]<stdout>: twice")
    print(f"rank {rank} i={i} the next line")
sys.stderr.write(f"rank {rank} on stderr [1,0]<stderr>: mid-line\n")
sys.stderr.flush()
if rank == 1:
    os.write(1, b"".join(b"%03d\n" % i for i in range(1000)))  # one write, as a C extension would
    os.write(1, "é".encode() * 700 + b"\n")
