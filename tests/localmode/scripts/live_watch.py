"""The job watched live, seen from inside the job (SDK v2 local mode has no TensorBoard output
config: BYOC_TENSORBOARD=1 is the stand-in). Every rank steps; after --hold-at steps rank 0
(on the leader, whose entrypoint writes the events) reads /opt/ml/output/tensorboard/byoc-job
with tensorboardX's protos (the image has no tensorboard) until both ranks' and both hosts'
scalars are there, while the other rank waits for it in the next all-reduce; it writes what
it saw, and when, to SM_MODEL_DIR/live.json."""
import glob
import json
import os
import struct
import time

import torch
import torch.distributed as dist

FOLDER = "/opt/ml/output/tensorboard/byoc-job"


def read_tags() -> set:
    from tensorboardX.proto.event_pb2 import Event

    tags = set()
    for path in glob.glob(os.path.join(FOLDER, "events.out.tfevents.*")):
        data = open(path, "rb").read()
        pos = 0
        while pos + 12 <= len(data):  # TFRecord: length, its CRC, the record, its CRC
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            if pos + 16 + length > len(data):
                break
            event = Event.FromString(data[pos + 12:pos + 12 + length])
            tags.update(v.tag for v in event.summary.value)
            pos += 16 + length
    return tags


dist.init_process_group("gloo")
rank = dist.get_rank()
hosts = json.loads(os.environ["SM_HOSTS"])
wanted = {"rank/0/step_ms", "rank/1/step_ms"} | {f"host/{h}/cpu_pct" for h in hosts}
model = torch.nn.Linear(32, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
first_step_at, seen = None, {}
for step in range(12):
    loss = model(torch.randn(16, 32)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    first_step_at = first_step_at or time.time()
    if step == 4 and rank == 0:
        deadline = time.time() + 120
        while not wanted <= set(seen) and time.time() < deadline:
            for tag in read_tags():
                seen.setdefault(tag, round(time.time() - first_step_at, 2))
            time.sleep(0.25)
        with open(os.path.join(os.environ["SM_MODEL_DIR"], "live.json"), "w") as f:
            json.dump({"wanted": sorted(wanted), "seen_after_first_step_s": seen}, f)
dist.destroy_process_group()
