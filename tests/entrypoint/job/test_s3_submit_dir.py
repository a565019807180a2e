"""sagemaker_submit_directory on S3 (what the SDK uploads: s3://<bucket>/<job>/source/sourcedir.tar.gz),
fetched for real over HTTP from a local S3 (moto's server), with the toolkit's S3_ENDPOINT_URL."""

from __future__ import annotations

import io
import tarfile

import pytest

from support.ports import free_port
from support.jobtree import failure_text, run_entrypoint, write_tree

moto_server = pytest.importorskip("moto.server", reason="moto[server] is a test extra: pip install -e '.[test]'")
boto3 = pytest.importorskip("boto3")

BUCKET = "sagemaker-us-east-1-123456789012"
KEY = "job-1/source/sourcedir.tar.gz"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def build_sourcedir() -> bytes:
    """A package the way the SDK tars source_dir: the entry point imports a sibling module."""
    files = {
        "train.py": "import os, sys, helper\n"
                    "open(os.path.join(os.environ['SM_MODEL_DIR'], 'ran'), 'w').write(helper.WHERE + ' ' + os.getcwd()"
                    " + ' ' + ' '.join(sys.argv[1:]))\n",
        "helper.py": "WHERE = 'from-s3'\n",
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def s3_endpoint():
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key=KEY, Body=build_sourcedir())
        yield endpoint
    finally:
        server.stop()


def test_source_directory_from_s3_is_fetched_extracted_and_run(tmp_path, s3_endpoint):
    root = write_tree(tmp_path / "ml", hyperparameters={"sagemaker_submit_directory": f"s3://{BUCKET}/{KEY}",
                                                       "epochs": 3})
    done = run_entrypoint(root, S3_ENDPOINT_URL=s3_endpoint, **CREDENTIALS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"fetching the source directory from s3://{BUCKET}/{KEY}" in done.stdout + done.stderr
    assert (root / "model/ran").read_text() == f"from-s3 {root / 'code'} --epochs 3"
    assert (root / "code/helper.py").exists() and (root / "output/success").exists()


def test_missing_source_object_is_a_clear_job_error(tmp_path, s3_endpoint):
    uri = f"s3://{BUCKET}/job-1/source/missing.tar.gz"
    root = write_tree(tmp_path / "ml", hyperparameters={"sagemaker_submit_directory": uri})
    done = run_entrypoint(root, S3_ENDPOINT_URL=s3_endpoint, **CREDENTIALS)
    assert done.returncode == 2, done.stdout + done.stderr
    report = failure_text(root)
    # one line: what failed, which object, what S3 said
    assert f"could not fetch sagemaker_submit_directory {uri}: " in report.splitlines()[0]
    assert "(404)" in report and "Not Found" in report
    assert "Traceback" not in report and not (root / "output/success").exists()
