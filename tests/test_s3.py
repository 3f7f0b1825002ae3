"""S3 for real: moto's standalone server on 127.0.0.1 in a subprocess, spoken to through s3fs.

Nothing is mocked inside the test process: the converter, ``info``/``verify`` and the
reader reach the server over HTTP with credentials and the endpoint taken from the
environment (``AWS_*``), as a user's job would, or from ``storage_options``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from shardify.cli import main  # noqa: E402
from shardify.convert.options import ConvertOptions  # noqa: E402
from shardify.convert.synth import make_imagefolder  # noqa: E402
from shardify.convert.verify import dataset_info, verify_dataset  # noqa: E402
from shardify.convert.write.run import convert_imagefolder  # noqa: E402
from shardify.errors import ManifestError, OutputError  # noqa: E402
from shardify.reader import BatchOptions, CacheOptions  # noqa: E402

OPTS = ["--samples-per-shard", "4", "--workers", "2", "--quiet", "--no-fsync"]
TIME_LIMIT_S = 180


def _tree_bytes(out: Path) -> dict[str, bytes]:
    """Every file under ``out`` by relative path (to compare outputs byte for byte)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _key_and_label(sample: dict) -> tuple[str, int]:
    return str(sample["__key__"]), int(sample["cls"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on a free port of 127.0.0.1, stopped after the module."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start (exit {proc.poll()})") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _clear_s3fs_cache() -> None:
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Credentials and endpoint in the environment (inherited by CLI subprocesses), with no
    config file or instance metadata to fall back on."""
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    _clear_s3fs_cache()
    yield env
    _clear_s3fs_cache()


@pytest.fixture
def bucket(s3_env: dict[str, str]) -> str:
    """A new empty bucket."""
    import s3fs

    name = f"b-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(name)
    return name


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return make_imagefolder(tmp_path / "src", classes=3, per_class=6, sizes=((48, 40),))


def _s3_tree(prefix: str) -> dict[str, bytes]:
    """{name: bytes} of every object under ``prefix`` (bucket/ds), read back with s3fs."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    return {p[len(prefix) + 1 :]: fs.cat_file(p) for p in fs.find(prefix)}


def test_cli_convert_to_s3_is_byte_identical_to_local(bucket: str, source: Path, tmp_path: Path) -> None:
    local = tmp_path / "local"
    assert main(["convert", "imagefolder", str(source), str(local), *OPTS]) == 0
    assert main(["convert", "imagefolder", str(source), f"s3://{bucket}/ds", *OPTS]) == 0
    assert _s3_tree(f"{bucket}/ds") == _tree_bytes(local)


def test_killed_conversion_to_s3_resumes_byte_identical(
    bucket: str,
    source: Path,
    tmp_path: Path,
) -> None:
    local = tmp_path / "local"
    assert main(["convert", "imagefolder", str(source), str(local), *OPTS]) == 0
    url = f"s3://{bucket}/ds"
    slow = [
        sys.executable,
        "-c",
        "import sys, time\n"
        "import shardify.convert.write.readsample as w\n"
        "check = w.check_image\n"
        "w.check_image = lambda *a, **k: (time.sleep(0.1), check(*a, **k))[1]\n"
        "from shardify.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n",
    ]
    proc = subprocess.Popen([*slow, "convert", "imagefolder", str(source), url, *OPTS], start_new_session=True)
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        fs.invalidate_cache()
        if len(fs.glob(f"{bucket}/ds/.shardify-work/train/0*.json")) >= 2:  # two shards recorded as finished
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    fs.invalidate_cache()
    before = fs.glob(f"{bucket}/ds/train-*.tar")
    assert 2 <= len(before) < 5, "the kill should land mid-run"
    assert not fs.exists(f"{bucket}/ds/manifest.json"), "a killed run must not look finished"

    rerun = subprocess.run(
        [sys.executable, "-m", "shardify.convert", "convert", "imagefolder", str(source), url, *OPTS],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert re.search(r"\b[234] reused\b", rerun.stderr), rerun.stderr
    assert _s3_tree(f"{bucket}/ds") == _tree_bytes(local)


def test_info_and_verify_accept_s3_urls(bucket: str, source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"s3://{bucket}/ds"
    assert main(["convert", "imagefolder", str(source), url, *OPTS]) == 0
    capsys.readouterr()
    for spec in (url, url + "/", f"{url}/manifest.json", f"{url}/train.json"):
        assert main(["verify", spec, "--json"]) == 0, spec
        report = json.loads(capsys.readouterr().out)
        assert report["ok"] and report["checked"]["train"] == {"shards": 5, "samples": 18}, spec
        assert main(["info", spec, "--json"]) == 0, spec
        info = json.loads(capsys.readouterr().out)
        assert info["splits"]["train"]["samples"] == 18 and info["splits"]["train"]["classes"] == 3, spec


def test_verify_finds_a_damaged_shard_on_s3(bucket: str, source: Path) -> None:
    import s3fs

    url = f"s3://{bucket}/ds"
    assert main(["convert", "imagefolder", str(source), url, *OPTS]) == 0
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    second = sorted(fs.glob(f"{bucket}/ds/train-*.tar"))[1].rsplit("/", 1)[1]  # train-{version}-000001.tar
    stray = second.replace("-000001.tar", "-000009.tar")
    data = bytearray(fs.cat_file(f"{bucket}/ds/{second}"))
    data[1000] ^= 0xFF
    fs.pipe_file(f"{bucket}/ds/{second}", bytes(data))
    fs.pipe_file(f"{bucket}/ds/{stray}", b"")
    report = verify_dataset(url)
    assert [(p.shard, p.message.split(" (")[0]) for p in report.problems] == [
        (second, "sha256 does not match the index"),
        (second, "sample 0's bytes do not match the index's per-sample checksum"),  # byte 1000 is in it
        (stray, "shard file not listed in the index"),
    ]


def test_reader_epoch_from_s3_equals_local_with_two_workers_sharing_the_cache(
    bucket: str, source: Path, tmp_path: Path
) -> None:
    import torch

    from shardify.reader import ShardedDataset

    local = tmp_path / "local"
    url = f"s3://{bucket}/ds"
    options = ConvertOptions(samples_per_shard=4, workers=1, progress=False, fsync=False)
    convert_imagefolder(source, local, options=options)
    convert_imagefolder(source, url, options=options)

    def epoch(spec: str, **kw) -> list[list[tuple[str, int]]]:
        ds = ShardedDataset(
            spec, batch_size=3, shuffle=True, seed=7, map=_key_and_label, batching=BatchOptions(collate_fn=list), **kw
        )
        return list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))

    cache = tmp_path / "cache"
    remote = epoch(url, cache=CacheOptions(dir=cache, ranged=False))
    assert remote == epoch(str(local)) == epoch(url)  # whole shards through the cache, and ranged reads
    assert sum(len(batch) for batch in remote) == 18
    cached = sorted(p.name.rsplit("-", 1)[1] for p in cache.iterdir() if p.is_file())
    assert cached == [f"{i:06d}.tar" for i in range(5)], "each shard fetched once into the shared cache"


def test_storage_options_carry_credentials_and_endpoint(
    s3_endpoint: str, bucket: str, source: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from shardify.reader.io.sources import resolve_source

    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k)
    _clear_s3fs_cache()
    storage = {"key": "testing", "secret": "testing", "endpoint_url": s3_endpoint}
    url = f"s3://{bucket}/ds"
    options = ConvertOptions(samples_per_shard=4, workers=2, progress=False, fsync=False, storage_options=storage)
    convert_imagefolder(source, url, options=options)
    convert_imagefolder(
        source, tmp_path / "local", options=ConvertOptions(samples_per_shard=4, workers=1, progress=False, fsync=False)
    )
    assert verify_dataset(url, storage_options=storage).ok
    src = resolve_source(url, storage_options=storage, cache_dir=tmp_path / "cache")
    assert src.num_samples == 18
    with src.open_tar(src.shards[0].url)[0] as f:
        assert f.read() == next((tmp_path / "local").glob("train-*-000000.tar")).read_bytes()


@pytest.mark.parametrize("problem", ["no-credentials", "no-bucket"])
def test_missing_credential_or_bucket_is_a_quick_clear_error(
    problem: str, bucket: str, source: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardify.reader import ShardedDataset

    url = f"s3://{bucket}/ds"
    assert main(["convert", "imagefolder", str(source), url, *OPTS]) == 0
    if problem == "no-credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        want = "Unable to locate credentials"
    else:
        url = f"s3://no-such-{bucket}/ds"
        want = "does not exist|not found|Not Found"
    _clear_s3fs_cache()
    capsys.readouterr()
    started = time.monotonic()
    with pytest.raises(OutputError, match=f"^{url}: .*({want})"):
        convert_imagefolder(source, url, options=ConvertOptions(samples_per_shard=4, workers=1, progress=False))
    with pytest.raises(ManifestError, match=f"^{url}/manifest.json: .*({want})"):
        dataset_info(url)
    assert main(["verify", url]) == 1
    assert url in capsys.readouterr().err
    with pytest.raises(ManifestError, match=f"{url}/manifest.json: .*({want})"):
        ShardedDataset(url, batch_size=2)
    assert time.monotonic() - started < 20, "errors come quickly, never after a hang"


def test_docs_s3_example_runs(bucket: str, source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shlex

    from shardify.reader import ShardedDataset

    readme = (Path(__file__).resolve().parents[1] / "docs" / "how-to" / "remote-data.md").read_text()
    block = readme.split("<!-- s3-example: run by tests/test_s3.py -->", 1)[1].split("<!-- /s3-example -->", 1)[0]
    shell = block.split("```bash\n", 1)[1].split("```", 1)[0]
    code = block.split("```python\n", 1)[1].split("```", 1)[0]

    def local(text: str) -> str:
        return (
            text.replace("my-bucket", bucket)
            .replace("~/data/train", str(source))
            .replace("/local/ssd/shardify-cache", str(tmp_path / "cache"))
        )

    for line in shell.splitlines():
        words = shlex.split(local(line.split("#", 1)[0]))
        if words[:1] == ["export"]:  # the endpoint: the fixture's server, already in the environment
            assert words[1].startswith("AWS_ENDPOINT_URL=")
        elif words:
            assert words[0] == "shardify"
            assert main([*words[1:], "--quiet"] if words[1] == "convert" else words[1:]) == 0, line
    from shardify.reader import CacheOptions

    scope: dict[str, object] = {"ShardedDataset": ShardedDataset, "CacheOptions": CacheOptions}
    exec(local(code), scope)
    ds = scope["ds"]
    assert isinstance(ds, ShardedDataset) and ds.source.num_samples == 18


def _py_sample(i: int) -> dict[str, object]:
    import numpy as np

    return {"npy": np.arange(i + 1, dtype=np.int16), "cls": i % 3, "txt": f"row {i}"}


def test_python_writers_to_s3_are_byte_identical_to_local(
    s3_endpoint: str, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ShardWriter and convert_items to an s3:// URL, credentials and endpoint in storage_options only."""
    from shardify.convert import ShardWriter, convert_items
    from shardify.convert.verify import verify_dataset

    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k)
    _clear_s3fs_cache()
    storage = {"key": "testing", "secret": "testing", "endpoint_url": s3_endpoint}
    for out, options in ((tmp_path / "local", None), (f"s3://{bucket}/py", storage)):
        with ShardWriter(out, split="train", samples_per_shard=4, fsync=False, storage_options=options) as w:
            for i in range(10):
                w.write(_py_sample(i))
        convert_items(
            range(10),
            _py_sample,
            out,
            split="val",
            samples_per_shard=4,
            workers=2,
            fsync=False,
            progress=False,
            storage_options=options,
        )
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **storage)
    remote = {p[len(bucket) + 4 :]: fs.cat_file(p) for p in fs.find(f"{bucket}/py")}
    assert remote == _tree_bytes(tmp_path / "local")
    assert sum(name.endswith(".tar") for name in remote) == 6
    assert verify_dataset(f"s3://{bucket}/py", storage_options=storage).ok


def test_sidecars_are_written_to_s3_and_ranged_reads_fetch_them_through_the_cache(
    bucket: str, source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardify.convert.write import finish
    from shardify.reader import ShardedDataset

    monkeypatch.setattr(finish, "SIDECAR_ABOVE_SAMPLES", 0)
    local, url = tmp_path / "local", f"s3://{bucket}/ds"
    options = ConvertOptions(samples_per_shard=4, workers=1, progress=False, fsync=False)
    convert_imagefolder(source, local, options=options)
    convert_imagefolder(source, url, options=options)
    tree = _s3_tree(f"{bucket}/ds")
    assert tree == _tree_bytes(local) and sum(name.endswith(".tar.idx") for name in tree) == 5

    def epoch(spec: str, **kw) -> list[tuple[str, int]]:
        ds = ShardedDataset(
            spec, batch_size=3, shuffle=True, seed=7, map=_key_and_label, batching=BatchOptions(collate_fn=list), **kw
        )
        return [s for batch in ds for s in batch]

    cache = tmp_path / "cache"
    assert epoch(url, cache=CacheOptions(dir=cache)) == epoch(str(local))
    cached = sorted(p.name.rsplit("-", 1)[1] for p in cache.iterdir() if p.is_file())
    compact = [n for n in cached if n.endswith(".cidx")]
    assert [n for n in cached if n not in compact] == [f"{i:06d}.tar.idx" for i in range(5)], "the sidecars, once"
    assert len(compact) == 1, "and the compact index the reader read instead of the JSON one, once"


def test_a_tampered_index_or_an_escaping_one_on_s3_is_refused_before_a_sample_is_read(
    bucket: str, source: Path
) -> None:
    """The manifest's record of the index is checked over S3 as locally (tests/reader/test_tampered.py)."""
    import s3fs

    from shardify.errors import IndexMismatchError, LocationError
    from shardify.reader import ShardedDataset

    url = f"s3://{bucket}/ds"
    assert main(["convert", "imagefolder", str(source), url, *OPTS]) == 0
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    manifest = json.loads(fs.cat_file(f"{bucket}/ds/manifest.json"))
    name = manifest["splits"]["train"]["index"]
    index = json.loads(fs.cat_file(f"{bucket}/ds/{name}"))
    index["shardlist"][2] = dict(index["shardlist"][1])  # shard 1's samples twice, shard 2's never
    fs.pipe_file(f"{bucket}/ds/{name}", json.dumps(index).encode())
    for cache in (CacheOptions(), CacheOptions(ranged=False)):
        with pytest.raises(IndexMismatchError, match="split 'train': entry 2 of the index names") as e:
            list(ShardedDataset(url, batch_size=3, cache=cache))
        assert (e.value.split, e.value.entry) == ("train", 2)
    assert any("entry 2" in p.message for p in verify_dataset(url).problems)
    manifest["splits"]["train"]["index"] = f"../other/{name}"
    fs.pipe_file(f"{bucket}/ds/manifest.json", json.dumps(manifest).encode())
    with pytest.raises(LocationError, match="refuses to read"):
        ShardedDataset(url, batch_size=3)
    assert any("refuses to read" in p.message for p in verify_dataset(url).problems)


def _ids(text: str) -> list[int]:
    return [int(w) for w in text.split()]


@pytest.mark.parametrize("chunk", [4, None], ids=["chunked", "per-sample"])
def test_packed_tokens_from_s3_equal_local_by_ranges(bucket: str, tmp_path: Path, chunk: int | None) -> None:
    from shardify.convert import convert_tokens
    from shardify.reader import TokenDataset

    texts = [" ".join(str(2 + (i * 7 + j) % 900) for j in range(i % 17 + 1)) for i in range(60)]
    kw = {"tokenizer": _ids, "vocab_size": 1000, "eos": 1, "chunk": chunk, "samples_per_shard": 20}
    kw |= {"workers": 1, "progress": False, "fsync": False}
    convert_tokens(texts, tmp_path / "local", **kw)
    convert_tokens(texts, f"s3://{bucket}/tok", **kw)

    def epoch(spec: str) -> list[list[list[int]]]:
        return [b["input_ids"].tolist() for b in TokenDataset(spec, seq_len=16, batch_size=4, seed=3)]

    assert epoch(f"s3://{bucket}/tok") == epoch(str(tmp_path / "local"))
