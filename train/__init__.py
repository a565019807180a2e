"""Training scripts for the image: DDP (train.ddp_train), Horovod (train.horovod_train),
mpi4py (train.mpi_train) and a torch.distributed.rpc parameter server (train.ps_train,
train.ps_server), sharing one loop (train.loop). See docs/training.md."""
