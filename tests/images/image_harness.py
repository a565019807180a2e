"""Build docker/Dockerfile.cpu and run it as the hosts of a SageMaker-like cluster, with
no Docker engine and no registry (see docs/images.md, "Testing the CPU image here").

- The base image is Debian bookworm made locally (docker/local/make-debian-base.sh).
- buildah builds the image (docker/build.sh --engine buildah) with the machine's local
  torch wheel folder bind-mounted, so torch is not downloaded.
- The result is cached in a private image store under $HOME/.cache/byoc-images (or
  $BYOC_IMAGE_CACHE), tagged by a hash of every input of the build: an unchanged tree
  reuses the image; a changed one rebuilds from buildah's layer cache.
- Hosts are network namespaces on an address-less bridge; each host is one `podman run`
  of the image joined to its namespace, with its hostname and a shared hosts file.

Verbs as elsewhere: decide_/build_ are pure, load_ reads files, probe_ asks the machine,
run_/start_/wait_/ensure_ act.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Mapping, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE_REPOSITORY = "localhost/byoc-training"
BASE_TAG = "localhost/debian:bookworm"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_CA_PATH = "/etc/byoc-build-ca.crt"  # where the build sees the machine's CA bundle

# Everything the CPU image is made of; the cache key hashes these files' paths and bytes.
BUILD_INPUTS = (
    "docker/Dockerfile.cpu",
    "docker/versions.env",
    "docker/build.sh",
    "docker/scripts",
    "docker/rootfs",
    "pyproject.toml",
    "entrypoint",
    "train",
    "localcluster",
)


@dataclasses.dataclass(frozen=True)
class ImageStore:
    """A private containers/storage store shared by buildah and podman (never the machine's)."""

    root: Path
    runroot: Path

    @property
    def global_args(self) -> list[str]:
        return ["--root", str(self.root), "--runroot", str(self.runroot), "--storage-driver", "overlay"]


@dataclasses.dataclass(frozen=True)
class BuildResult:
    tag: str
    cached: bool
    seconds: float
    size_bytes: int


def load_store() -> ImageStore:
    cache = Path(os.environ.get("BYOC_IMAGE_CACHE") or Path.home() / ".cache" / "byoc-images")
    return ImageStore(root=cache / "storage", runroot=Path("/run/byoc-images"))


# --- deciding (pure) ----------------------------------------------------------------------


def decide_cache_key(files: Sequence[tuple[str, bytes]], wheels: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for name, data in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    for wheel in sorted(wheels):
        digest.update(b"wheel\0" + wheel.encode())
    return digest.hexdigest()[:16]


def build_pip_conf(find_links: Sequence[str]) -> str:
    """pip's configuration inside the build: the local wheel folders, the machine's CAs."""
    lines = ["[global]", f"cert = {BUILD_CA_PATH}"]
    if find_links:
        lines.append("find-links = " + " ".join(find_links))
    return "\n".join(lines) + "\n"


def build_build_argv(store: ImageStore, tag: str, find_links: Sequence[str], conf_dir: Path) -> list[str]:
    """docker/build.sh for the CPU flavour with buildah, against the local base image.

    With a local wheel folder, PyTorch's CPU index is not asked (it is unreachable from
    machines that reach only PyPI); pip finds torch in the folder instead."""
    argv = [
        "bash", str(REPO_ROOT / "docker" / "build.sh"),
        "--flavor", "cpu", "--tag", tag, "--engine", "buildah",
        "--buildah-root", str(store.root), "--buildah-runroot", str(store.runroot),
        "--set", f"CPU_BASE_IMAGE={BASE_TAG}", "--set", f"CPU_BUILDER_IMAGE={BASE_TAG}",
    ]
    if find_links:
        argv += ["--set", "CPU_TORCH_INDEX_URL="]
    argv += ["--", "-v", f"{conf_dir / 'pip.conf'}:/etc/pip.conf:ro",
             "-v", f"{HOST_CA_BUNDLE}:{BUILD_CA_PATH}:ro"]
    for folder in find_links:
        argv += ["-v", f"{folder}:{folder}:ro"]
    return argv


def build_podman_argv(store: ImageStore, args: Sequence[str]) -> list[str]:
    """podman as it runs on these machines: in a private mount namespace without the
    cgroup v2 'unified' mount (hybrid cgroups otherwise make it fail), cgroupfs manager."""
    return [
        "unshare", "--mount", "--propagation", "private", "--",
        "sh", "-c",
        'if mountpoint -q /sys/fs/cgroup/unified; then umount /sys/fs/cgroup/unified; fi; exec "$@"',
        "sh", "podman", *store.global_args, "--cgroup-manager", "cgroupfs", *args,
    ]


def build_run_args(
    image: str,
    *,
    name: str,
    hostname: str | None = None,
    netns: str | None = None,
    hosts_file: Path | None = None,
    mounts: Sequence[tuple[Path, str]] = (),
    env: Mapping[str, str] | None = None,
    entrypoint: str | None = None,
    command: Sequence[str] = (),
    timeout_s: int = 300,
) -> list[str]:
    """`podman run` arguments for one host of the emulated cluster."""
    args = [
        "run", "--rm", "--name", name, "--timeout", str(timeout_s),
        # Without these podman fails here: "setrlimit RLIMIT_NOFILE: Operation not permitted".
        "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096",
    ]
    args += ["--network", f"ns:/run/netns/{netns}"] if netns else ["--network", "none"]
    if hostname:
        args += ["--hostname", hostname]
    if hosts_file:
        args += ["-v", f"{hosts_file}:/etc/hosts:ro"]
    for source, target in mounts:
        args += ["-v", f"{source}:{target}"]
    for key, value in (env or {}).items():
        args += ["--env", f"{key}={value}"]
    if entrypoint is not None:
        args += ["--entrypoint", entrypoint]
    return [*args, image, *command]


# --- reading and probing -------------------------------------------------------------------


def load_build_inputs(root: Path = REPO_ROOT) -> list[tuple[str, bytes]]:
    files = []
    for entry in BUILD_INPUTS:
        path = root / entry
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in candidates:
            if "__pycache__" in file.parts or file.suffix == ".pyc":
                continue
            # The mode matters too: the scripts must stay executable.
            files.append((f"{file.relative_to(root)}:{file.stat().st_mode & 0o111:o}", file.read_bytes()))
    return files


def probe_find_links() -> list[str]:
    """The machine's local wheel folders (PIP_FIND_LINKS, else pip's configuration)."""
    raw = os.environ.get("PIP_FIND_LINKS", "")
    if not raw:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
            capture_output=True, text=True,
        )
        raw = result.stdout if result.returncode == 0 else ""
    return [f for f in raw.split() if os.path.isdir(f)]


def probe_wheels(find_links: Sequence[str]) -> list[str]:
    return sorted(f"{w.name}:{w.stat().st_size}" for d in find_links for w in Path(d).glob("*.whl"))


def probe_image_exists(store: ImageStore, tag: str) -> bool:
    result = subprocess.run(["podman", *store.global_args, "image", "exists", tag], capture_output=True)
    return result.returncode == 0


def probe_image_config(store: ImageStore, tag: str) -> dict:
    out = subprocess.run(
        ["podman", *store.global_args, "image", "inspect", tag],
        capture_output=True, text=True, check=True,
    ).stdout
    return json.loads(out)[0]


# --- acting ----------------------------------------------------------------------------------


def run_checked(argv: Sequence[str], what: str, timeout_s: float, log: Path | None = None) -> None:
    """Runs a step; on failure raises with the tail of its output (and where the rest is)."""
    with open(log, "ab") if log else contextlib.nullcontext() as sink:
        result = subprocess.run(
            argv, stdout=sink or subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout_s,
        )
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:] if log else (result.stdout or b"").decode(errors="replace")[-4000:]
        raise RuntimeError(f"{what} failed (exit {result.returncode}); last output:\n{tail}"
                           + (f"\nfull log: {log}" if log else ""))


@contextlib.contextmanager
def store_lock(store: ImageStore) -> Iterator[None]:
    """One build or base creation at a time in a store (parallel test runs share it)."""
    store.root.parent.mkdir(parents=True, exist_ok=True)
    with open(store.root.parent / "lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def ensure_cpu_image(store: ImageStore | None = None, timeout_s: float = 1800) -> BuildResult:
    """The CPU image for the current tree: reused when its inputs are unchanged, else built."""
    store = store or load_store()
    cache_dir = store.root.parent
    find_links = probe_find_links()
    key = decide_cache_key(load_build_inputs(), probe_wheels(find_links))
    tag = f"{IMAGE_REPOSITORY}:cpu-{key}"
    with store_lock(store):
        if probe_image_exists(store, tag):
            size = int(probe_image_config(store, tag)["Size"])
            return BuildResult(tag, cached=True, seconds=0.0, size_bytes=size)
        log = cache_dir / f"build-{key}.log"
        log.unlink(missing_ok=True)
        run_checked(["bash", str(REPO_ROOT / "docker" / "install-build-tools.sh")],
                    "installing buildah/podman/debootstrap", 600, log)
        run_checked(["bash", str(REPO_ROOT / "docker" / "local" / "make-debian-base.sh"),
                     str(store.root), str(store.runroot), BASE_TAG],
                    "making the Debian base image", 600, log)
        conf_dir = cache_dir / "build-conf"
        conf_dir.mkdir(parents=True, exist_ok=True)
        (conf_dir / "pip.conf").write_text(build_pip_conf(find_links))
        started = time.monotonic()
        run_checked(build_build_argv(store, tag, find_links, conf_dir), "buildah bud", timeout_s, log)
        seconds = time.monotonic() - started
        size = int(probe_image_config(store, tag)["Size"])
        with open(cache_dir / "builds.jsonl", "a") as record:
            record.write(json.dumps({"tag": tag, "seconds": round(seconds, 1), "size_bytes": size,
                                     "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
        remove_other_cpu_tags(store, keep=tag)
        remove_stale_layers(store, parse_used_images(log.read_text(errors="replace")))
        for old_log in cache_dir.glob("build-*.log"):
            if old_log != log:
                old_log.unlink(missing_ok=True)
        return BuildResult(tag, cached=False, seconds=seconds, size_bytes=size)


def remove_other_cpu_tags(store: ImageStore, keep: str) -> None:
    """Older builds' tags go; their layers stay as buildah's cache for the next build."""
    out = subprocess.run(
        ["podman", *store.global_args, "images", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_REPOSITORY],
        capture_output=True, text=True,
    ).stdout.split()
    for tag in out:
        if tag != keep and tag.startswith(f"{IMAGE_REPOSITORY}:cpu-"):
            subprocess.run(["podman", *store.global_args, "untag", tag, tag], capture_output=True)


def parse_used_images(build_log: str) -> set[str]:
    """IDs (short) of every step image the build made or reused: its layer cache."""
    return set(re.findall(r"^--> (?:Using cache )?([0-9a-f]{11,64})\b", build_log, re.M))


def decide_stale_images(dangling: Sequence[str], used: set[str]) -> list[str]:
    """Untagged images no step of the latest build used: earlier builds' layers."""
    return [image for image in dangling if not any(image.startswith(u[:11]) or u.startswith(image) for u in used)]


def remove_stale_layers(store: ImageStore, used: set[str]) -> None:
    """Keeps the store from growing by a few GB with every changed build."""
    dangling = subprocess.run(
        ["podman", *store.global_args, "images", "-a", "--filter", "dangling=true", "--format", "{{.ID}}"],
        capture_output=True, text=True,
    ).stdout.split()
    for image in decide_stale_images(dangling, used):
        subprocess.run(["podman", *store.global_args, "rmi", image], capture_output=True)


def run_podman(store: ImageStore, args: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run(build_podman_argv(store, args), capture_output=True, text=True, timeout=timeout_s)


# --- emulated hosts ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Host:
    name: str  # algo-1, ...
    netns: str
    address: str


@dataclasses.dataclass(frozen=True)
class Network:
    bridge: str
    hosts: tuple[Host, ...]
    veths: tuple[str, ...]
    hosts_file: Path


def decide_network(run_id: int, names: Sequence[str], workdir: Path) -> Network:
    """Names short enough for interfaces (15 characters) and unique per test process; a
    /24 from 10.231.0.0/16 picked by the run id, used only inside these namespaces."""
    tag = f"{run_id % 100000}"
    subnet = f"10.231.{run_id % 250 + 1}"
    hosts = tuple(Host(name, f"byocimg{tag}h{i}", f"{subnet}.{10 + i}") for i, name in enumerate(names, 1))
    return Network(
        bridge=f"bib{tag}",
        hosts=hosts,
        veths=tuple(f"biv{tag}h{i}" for i in range(1, len(names) + 1)),
        hosts_file=workdir / "hosts",
    )


def build_hosts_file(network: Network) -> str:
    lines = ["127.0.0.1 localhost"]
    lines += [f"{h.address} {h.name}" for h in network.hosts]
    return "\n".join(lines) + "\n"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def start_network(names: Sequence[str], workdir: Path) -> Iterator[Network]:
    """Bridge (no address: nothing routes out) + one namespace per host with eth0 and lo."""
    network = decide_network(os.getpid(), names, workdir)
    network.hosts_file.write_text(build_hosts_file(network))
    forward_rule = ["FORWARD", "-i", network.bridge, "-o", network.bridge, "-j", "ACCEPT"]
    added_rule = False
    try:
        _ip("link", "add", network.bridge, "type", "bridge")
        _ip("link", "set", network.bridge, "up")
        for host, veth in zip(network.hosts, network.veths):
            _ip("netns", "add", host.netns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
            _ip("link", "set", f"{veth}p", "netns", host.netns)
            _ip("-n", host.netns, "link", "set", f"{veth}p", "name", "eth0")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
            _ip("link", "set", veth, "master", network.bridge)
            _ip("link", "set", veth, "up")
        # Bridged traffic may pass through iptables (br_netfilter); let the bridge talk to itself.
        nf = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
        if nf.exists() and nf.read_text().strip() == "1" and shutil.which("iptables"):
            subprocess.run(["iptables", "-I", *forward_rule], check=True, capture_output=True)
            added_rule = True
        yield network
    finally:
        if added_rule:
            subprocess.run(["iptables", "-D", *forward_rule], capture_output=True)
        for host, veth in zip(network.hosts, network.veths):
            subprocess.run(["ip", "link", "del", veth], capture_output=True)
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
        subprocess.run(["ip", "link", "del", network.bridge], capture_output=True)


# --- a SageMaker-like job folder ----------------------------------------------------------------


def build_resource_config(current: str, hosts: Sequence[str]) -> dict:
    return {"current_host": current, "hosts": list(hosts), "current_instance_type": "local",
            "current_group_name": "homogeneousCluster", "network_interface_name": "eth0"}


def build_hyperparameters(values: Mapping[str, object]) -> dict[str, str]:
    """Every value JSON-encoded, as the SageMaker Python SDK (>= 2.110) writes them."""
    return {key: json.dumps(value) for key, value in values.items()}


def write_job_tree(workdir: Path, hosts: Sequence[str], hyperparameters: Mapping[str, object],
                   code: Mapping[str, str], channels: Mapping[str, Mapping[str, bytes]] | None = None,
                   ) -> dict[str, list[tuple[Path, str]]]:
    """Like SageMaker local mode: input/ and output/ per host; code/, model/ and each
    channel's data shared by all hosts. Returns each host's mounts."""
    shared_code, shared_model = workdir / "code", workdir / "model"
    shared_code.mkdir(parents=True, exist_ok=True)
    shared_model.mkdir(parents=True, exist_ok=True)
    for name, text in code.items():
        (shared_code / name).write_text(text)
    channels = channels or {}
    channel_mounts = []
    for channel, files in channels.items():
        folder = workdir / "data" / channel
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (folder / name).write_bytes(data)
        channel_mounts.append((folder, f"/opt/ml/input/data/{channel}"))
    input_data_config = {c: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated"}
                         for c in channels}
    mounts = {}
    for host in hosts:
        base = workdir / host
        config = base / "input" / "config"
        config.mkdir(parents=True, exist_ok=True)
        (base / "input" / "data").mkdir(exist_ok=True)
        (base / "output" / "data").mkdir(parents=True, exist_ok=True)
        (config / "resourceconfig.json").write_text(json.dumps(build_resource_config(host, hosts)))
        (config / "hyperparameters.json").write_text(json.dumps(build_hyperparameters(hyperparameters)))
        (config / "inputdataconfig.json").write_text(json.dumps(input_data_config))
        for channel in channels:
            (base / "input" / "data" / channel).mkdir(exist_ok=True)  # the mount point
        mounts[host] = [(base / "input", "/opt/ml/input"), (base / "output", "/opt/ml/output"),
                        (shared_code, "/opt/ml/code"), (shared_model, "/opt/ml/model"),
                        *channel_mounts]
    return mounts


@dataclasses.dataclass(frozen=True)
class HostRun:
    host: str
    returncode: int
    output: str


def run_hosts(store: ImageStore, image: str, network: Network, mounts: Mapping[str, list[tuple[Path, str]]],
              command: Sequence[str] = ("train",), timeout_s: int = 240) -> list[HostRun]:
    """Every host's container at once, each `docker run <image> train` in its namespace."""
    procs = []
    for host in network.hosts:
        args = build_run_args(
            image, name=f"{host.netns}-c", hostname=host.name, netns=host.netns,
            hosts_file=network.hosts_file, mounts=mounts[host.name], command=command,
            timeout_s=timeout_s,
        )
        procs.append((host, subprocess.Popen(build_podman_argv(store, args), stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, text=True)))
    results = []
    for host, proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout_s + 60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        results.append(HostRun(host.name, proc.returncode, out))
    return results
