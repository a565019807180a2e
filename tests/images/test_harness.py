"""The image harness's pure parts, by value (the slow tests in test_cpu_image.py use them)."""

from pathlib import Path

from tests.images.image_harness import (
    BASE_TAG,
    ImageStore,
    build_build_argv,
    build_hyperparameters,
    build_hosts_file,
    build_pip_conf,
    build_podman_argv,
    build_run_args,
    decide_cache_key,
    decide_network,
    decide_stale_images,
    parse_used_images,
    load_build_inputs,
)

STORE = ImageStore(Path("/c/storage"), Path("/run/x"))


def test_cache_key_follows_content_mode_and_wheels():
    files = [("a:0", b"1"), ("b:111", b"2")]
    key = decide_cache_key(files, ["torch.whl:10"])
    assert key == decide_cache_key(list(reversed(files)), ["torch.whl:10"])
    assert key != decide_cache_key([("a:0", b"1"), ("b:111", b"3")], ["torch.whl:10"])
    assert key != decide_cache_key([("a:0", b"1"), ("b:0", b"2")], ["torch.whl:10"])
    assert key != decide_cache_key(files, ["torch.whl:11"])


def test_build_inputs_cover_what_the_dockerfile_copies_and_skip_bytecode():
    names = {name.split(":")[0] for name, _ in load_build_inputs()}
    assert "docker/Dockerfile.cpu" in names and "docker/versions.env" in names
    assert "docker/scripts/install-torch.sh" in names and "pyproject.toml" in names
    assert any(n.startswith("entrypoint/") for n in names)
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)


def test_pip_conf_points_at_the_mounted_ca_and_wheels():
    assert build_pip_conf(["/opt/wheels"]) == (
        "[global]\ncert = /etc/byoc-build-ca.crt\nfind-links = /opt/wheels\n"
    )
    assert "find-links" not in build_pip_conf([])


def test_build_argv_mounts_wheels_and_skips_the_torch_index_only_with_them():
    argv = build_build_argv(STORE, "localhost/i:cpu-k", ["/opt/wheels"], Path("/c/conf"))
    assert argv[argv.index("--tag") + 1] == "localhost/i:cpu-k"
    assert f"CPU_BASE_IMAGE={BASE_TAG}" in argv and "CPU_TORCH_INDEX_URL=" in argv
    engine_args = argv[argv.index("--") + 1:]
    assert engine_args == [
        "-v", "/c/conf/pip.conf:/etc/pip.conf:ro",
        "-v", "/etc/ssl/certs/ca-certificates.crt:/etc/byoc-build-ca.crt:ro",
        "-v", "/opt/wheels:/opt/wheels:ro",
    ]
    assert "CPU_TORCH_INDEX_URL=" not in build_build_argv(STORE, "t", [], Path("/c"))


def test_podman_runs_in_a_private_mount_namespace_without_the_unified_cgroup():
    argv = build_podman_argv(STORE, ["run", "img"])
    assert argv[:4] == ["unshare", "--mount", "--propagation", "private"]
    assert "umount /sys/fs/cgroup/unified" in argv[7]
    assert argv[9:] == ["podman", "--root", "/c/storage", "--runroot", "/run/x", "--storage-driver",
                        "overlay", "--cgroup-manager", "cgroupfs", "run", "img"]


def test_run_args_for_one_host():
    args = build_run_args(
        "img:1", name="n", hostname="algo-1", netns="ns1", hosts_file=Path("/w/hosts"),
        mounts=[(Path("/w/in"), "/opt/ml/input")], env={"A": "b c"}, command=["train"], timeout_s=60,
    )
    assert args == [
        "run", "--rm", "--name", "n", "--timeout", "60",
        "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096",
        "--network", "ns:/run/netns/ns1", "--hostname", "algo-1", "-v", "/w/hosts:/etc/hosts:ro",
        "-v", "/w/in:/opt/ml/input", "--env", "A=b c", "img:1", "train",
    ]


def test_network_names_fit_interfaces_and_hosts_resolve_to_their_namespace():
    network = decide_network(4194301, ["algo-1", "algo-2"], Path("/w"))
    assert all(len(v) + 1 <= 15 for v in network.veths) and len(network.bridge) <= 15
    assert [h.address for h in network.hosts] == ["10.231.52.11", "10.231.52.12"]
    assert build_hosts_file(network) == "127.0.0.1 localhost\n10.231.52.11 algo-1\n10.231.52.12 algo-2\n"


def test_hyperparameters_are_json_encoded_like_the_sdk():
    assert build_hyperparameters({"sagemaker_program": "job.py", "epochs": 1}) == {
        "sagemaker_program": '"job.py"', "epochs": "1",
    }


def test_layers_of_the_latest_build_are_kept_the_rest_pruned():
    log = "[1/3] STEP 2/6: SHELL\n--> Using cache 4b08996734c4ad42e52a659cc5b9a6e0ddeca0861491a2e7dd9553a80bff6345\n--> 4b08996734c\n[1/3] STEP 5/6: COPY x\n--> 5f82087fd77\n"
    used = parse_used_images(log)
    assert {u[:11] for u in used} == {"4b08996734c", "5f82087fd77"}
    assert decide_stale_images(["4b08996734c4", "5f82087fd771", "0123456789ab"], used) == ["0123456789ab"]
