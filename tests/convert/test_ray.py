"""Conversion on a real local Ray instance, and output to an fsspec URL: the same bytes as locally."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardify.convert.synth import make_imagefolder
from shardify.convert.write.run import convert_imagefolder

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def source(tmp_path: Path, make_image) -> Path:
    root = make_imagefolder(tmp_path / "src", classes=3, per_class=5, sizes=((64, 48),))
    (root / "n00000001" / "broken.jpg").write_bytes(make_image()[:300])
    return root


def test_ray_output_is_byte_identical_to_local(local_ray, source: Path, tmp_path: Path, options, tree_bytes) -> None:
    local = convert_imagefolder(source, tmp_path / "local", options=options(samples_per_shard=4))
    on_ray = convert_imagefolder(source, tmp_path / "ray", options=options(samples_per_shard=4, engine="ray"))
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")
    assert [p.path for p in on_ray.splits["train"].skipped] == ["n00000001/broken.jpg"]
    assert on_ray.splits["train"].samples == local.splits["train"].samples == 15


def test_ray_strict_error_names_the_remote_file(local_ray, source: Path, tmp_path: Path, options) -> None:
    from shardify.errors import InputError

    with pytest.raises(InputError, match=r"^n00000001/broken\.jpg \(key 'n00000001__broken'\): cannot decode jpg"):
        convert_imagefolder(source, tmp_path / "out", options=options(samples_per_shard=4, engine="ray", strict=True))
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_fsspec_url_output_matches_local(source: Path, tmp_path: Path, options, tree_bytes) -> None:
    pytest.importorskip("fsspec")
    convert_imagefolder(source, tmp_path / "local", options=options(samples_per_shard=4, workers=2))
    convert_imagefolder(source, f"file://{tmp_path / 'url'}", options=options(samples_per_shard=4, workers=2))
    assert tree_bytes(tmp_path / "url") == tree_bytes(tmp_path / "local")
    manifest = json.loads((tmp_path / "url" / "manifest.json").read_text())
    assert manifest["splits"]["train"]["samples"] == 15


def test_ray_to_fsspec_url_resumes_after_failure(local_ray, source: Path, tmp_path: Path, options, tree_bytes) -> None:
    convert_imagefolder(source, tmp_path / "ref", options=options(samples_per_shard=4))
    url = f"file://{tmp_path / 'url'}"
    with pytest.MonkeyPatch.context() as mp:
        from shardify.convert.write import finish

        def crash(*a, **k):
            raise KeyboardInterrupt

        mp.setattr(finish, "write_report", crash)
        with pytest.raises(KeyboardInterrupt):
            convert_imagefolder(source, url, options=options(samples_per_shard=4, engine="ray"))
    assert not (tmp_path / "url" / "manifest.json").exists()
    result = convert_imagefolder(source, url, options=options(samples_per_shard=4, engine="ray"))
    assert result.splits["train"].reused_shards == 4
    assert tree_bytes(tmp_path / "url") == tree_bytes(tmp_path / "ref")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory):
    """``(address, env, temp folder)`` of a separate local Ray cluster, as a cluster user has one:
    ``ray start --head --block`` on 127.0.0.1 in its own process group and temp folder,
    killed after the module (``ray stop`` is not used: it would stop every Ray on the
    machine). Token authentication is off on both sides (``RAY_AUTH_MODE=disabled``), as on
    a private cluster; a user's cluster with tokens needs the token in the driver's environment."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    ray_cli = shutil.which("ray", path=os.path.dirname(sys.executable))
    if ray_cli is None:
        pytest.skip("no ray command beside this Python")
    port = _free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    temp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    proc = subprocess.Popen(
        [
            ray_cli,
            "start",
            "--head",
            "--block",
            "--node-ip-address",
            "127.0.0.1",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            probe = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    f"import ray; ray.init(address={address!r}, "
                    "log_to_driver=False, configure_logging=False); ray.shutdown()",
                ],
                capture_output=True,
                timeout=120,
                env=env,
            )
            if probe.returncode == 0:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no Ray cluster at {address}: {probe.stderr.decode()[-2000:]}")
            time.sleep(1)
        yield address, env, Path(temp)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(temp, ignore_errors=True)


def test_cli_on_a_separate_ray_cluster_is_byte_identical_to_local(
    ray_cluster: tuple[str, dict[str, str], Path], source: Path, tmp_path: Path, tree_bytes
) -> None:
    import subprocess
    import sys

    address, env, temp = ray_cluster
    cmd = [sys.executable, "-m", "shardify.convert", "convert", "imagefolder", str(source)]
    opts = ["--samples-per-shard", "4", "--quiet", "--no-fsync"]
    local = subprocess.run([*cmd, str(tmp_path / "local"), *opts, "--workers", "1"], capture_output=True, text=True)
    assert local.returncode == 3, local.stderr  # 3: done, with the broken image skipped and reported
    drivers_before = len(list(temp.glob("session_*/logs/python-core-driver-*")))
    on_ray = subprocess.run(
        [*cmd, str(tmp_path / "ray"), *opts, "--engine", "ray", "--ray-address", address],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert on_ray.returncode == 3, on_ray.stderr
    assert "15 samples in 4 shards" in on_ray.stderr and "skipped n00000001/broken.jpg" in on_ray.stderr
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")
    drivers_after = len(list(temp.glob("session_*/logs/python-core-driver-*")))
    assert drivers_after > drivers_before, "the conversion ran as a driver of the fixture's cluster"
