"""Issue 42, item 15, with real Ray (slow: each cluster start takes 10-20 s on 2 cores): a local
cluster is private. A stale address file (a cluster that stopped) does not break start-up, and a
cluster started on the machine with `ray start` is joined only when asked (`address="auto"`).

Each check runs in a fresh interpreter with its own RAY_TMPDIR, so that the address file here
never reaches another process of the machine; the `ray start` cluster is stopped by killing its
own process group (never `ray stop`, which stops every cluster of the user)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

PROBE = """
import json, sys
from agentrl.infra.cluster import ensure_ray
import ray
ensure_ray(sys.argv[1] or None, num_cpus=1)
@ray.remote
def f():
    return 41 + 1
print(json.dumps({"gcs": ray.get_runtime_context().gcs_address, "value": ray.get(f.remote())}))
"""


def _probe(tmp: str, address: str = "") -> dict:
    env = {**os.environ, "RAY_TMPDIR": tmp, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / ".pp"), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-c", PROBE, address], env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def ray_tmp():
    # short: Ray's unix sockets live under it (107-byte path limit)
    tmp = tempfile.mkdtemp(prefix="ry", dir="/tmp")
    yield tmp
    subprocess.run(["rm", "-rf", tmp], check=False)


def test_a_stale_address_file_does_not_break_start_up(ray_tmp):
    (Path(ray_tmp) / "ray").mkdir()
    (Path(ray_tmp) / "ray" / "ray_current_cluster").write_text("127.0.0.1:1\n")  # nobody there
    got = _probe(ray_tmp)
    assert got["value"] == 42 and not got["gcs"].endswith(":1")


def test_a_running_cluster_is_joined_only_when_asked(ray_tmp):
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    head = subprocess.Popen(["ray", "start", "--head", "--port=0", "--num-cpus=1", "--block",
                             "--include-dashboard=false"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        address_file = Path(ray_tmp) / "ray" / "ray_current_cluster"
        deadline = time.monotonic() + 120
        while not (address_file.exists() and address_file.read_text().strip()):
            assert head.poll() is None and time.monotonic() < deadline, "ray start failed"
            time.sleep(0.5)
        head_gcs = address_file.read_text().strip()
        private = _probe(ray_tmp)  # no address: a new cluster of its own
        assert private["value"] == 42 and private["gcs"] != head_gcs
        joined = _probe(ray_tmp, "auto")  # explicit: the running one
        assert joined["value"] == 42 and joined["gcs"] == head_gcs
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
