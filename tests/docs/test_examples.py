"""Every code example in README.md and docs/ runs, or says why it does not.

A fenced ``python`` or ``bash`` block is run unless the line before it (blank lines apart) is an
HTML comment ``<!-- not run: REASON -->`` (REASON must be given), or ``<!-- ... run by
tests/PATH -->``, naming the test that runs it instead (that file must exist and name the page).
The blocks of one page run in order in one folder, so a page can convert in one block and read
in the next; the folder starts with the small example data the pages use (see
:func:`example_data`), and ``HOME`` is that folder, so ``~/data/...`` paths are real. Python
blocks run in forked children of one warm process (``forkrun.py``), bash blocks with ``bash -e``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUN_LANGS = {"python", "bash"}
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)\s*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->\s*$")
RUN_BY = re.compile(r"^\s*<!--.*\brun by (?P<test>tests/\S+?\.py)\b.*-->\s*$")
EXAMPLE_TIMEOUT_S = 60


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str  # the comment line before the block, or ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a page, with the comment line that precedes each."""
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = len(m["indent"]), m["lang"], i
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:])
            i += 1
        i += 1
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = lines[k].strip() if k >= 0 and lines[k].strip().startswith("<!--") else ""
        out.append(Block(page, start + 1, lang, "\n".join(body) + "\n", marker))
    return out


def to_run(page: Path) -> list[Block]:
    return [
        b for b in blocks(page) if b.lang in RUN_LANGS and not NOT_RUN.match(b.marker) and not RUN_BY.match(b.marker)
    ]


def test_every_example_is_run_or_says_why_not() -> None:
    """A marker needs a reason or a test that exists and reads the page; code blocks say their language."""
    problems = []
    for page in PAGES:
        for b in blocks(page):
            if not b.lang:
                problems.append(f"{b.where}: a code block without a language (use text for output)")
            if b.marker.startswith("<!-- not run") and not NOT_RUN.match(b.marker):
                problems.append(f"{b.where}: 'not run' without a reason: {b.marker}")
            if m := RUN_BY.match(b.marker):
                test = ROOT / m["test"]
                if not test.is_file() or page.name not in test.read_text():
                    problems.append(f"{b.where}: {m['test']} does not exist or does not read {page.name}")
    assert problems == []


def test_markers_are_honoured(tmp_path: Path) -> None:
    """The parser sees what a page means: run, not run (with its reason), run elsewhere."""
    page = tmp_path / "p.md"
    page.write_text(
        "text\n\n```python\nx = 1\n```\n\n<!-- not run: needs a GPU -->\n```python\ncuda()\n```\n"
        "<!-- s3: run by tests/test_s3.py -->\n\n```bash\nshardify verify s3://b\n```\n"
        "  ```python\n  y = 2\n  ```\n```text\nout\n```\n"
    )
    found = blocks(page)
    assert [(b.lang, b.code) for b in found] == [
        ("python", "x = 1\n"),
        ("python", "cuda()\n"),
        ("bash", "shardify verify s3://b\n"),
        ("python", "y = 2\n"),
        ("text", "out\n"),
    ]
    assert NOT_RUN.match(found[1].marker)["reason"] == "needs a GPU"
    assert [b.code for b in to_run(page)] == ["x = 1\n", "y = 2\n"]


def test_readme_links_exist() -> None:
    """The README is read on its own (not part of the site's strict build): its relative links
    must name files of the repository."""
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(((?!https?://|#)[^)#]+)(?:#[^)]*)?\)", text)
    assert targets, "no relative links found: the pattern is wrong"
    assert [t for t in targets if not (ROOT / t).exists()] == []


def _ids_data(root: Path) -> None:
    """``data/<ID>.pt`` tensors with ``partition.json`` and ``labels.json``, as the map-style recipe has."""
    import torch

    (root / "data").mkdir()
    ids = [f"id{i:03d}" for i in range(24)]
    for i, sid in enumerate(ids):
        torch.save(torch.full((3, 8, 8), float(i)), root / "data" / f"{sid}.pt")
    (root / "partition.json").write_text(json.dumps({"train": ids[:16], "validation": ids[16:]}))
    (root / "labels.json").write_text(json.dumps({sid: i % 3 for i, sid in enumerate(ids)}))


@pytest.fixture(scope="module")
def example_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the pages assume exists: image folders ``~/data/imagenet/{train,val}`` (``HOME`` is ``home/``) (and
    ``photos``, a
    copy of train), the converted ``out/imagenet`` (splits train and validation), and the
    ID-labelled tensors of ``data/``, and the clone's ``tools/`` and ``examples/``. Tiny: 3 classes of 64x48 JPEGs."""
    from shardify.convert.options import ConvertOptions
    from shardify.convert.synth import make_imagefolder
    from shardify.convert.write.run import convert_imagefolder

    root = tmp_path_factory.mktemp("example-data")
    sizes = ((64, 48), (48, 64), (72, 56))
    train = make_imagefolder(root / "home/data/imagenet/train", classes=3, per_class=12, sizes=sizes)
    val = make_imagefolder(root / "home/data/imagenet/val", classes=3, per_class=4, seed=1, sizes=sizes)
    shutil.copytree(train, root / "photos")
    for split, src in (("train", train), ("validation", val)):
        convert_imagefolder(
            src, root / "out/imagenet", options=ConvertOptions(split=split, progress=False, fsync=False)
        )
    _ids_data(root)
    (root / "tools").symlink_to(ROOT / "tools")  # the pages run scripts of the clone, as tools/...
    (root / "examples").symlink_to(ROOT / "examples")  # ... and as examples/...
    return root


@pytest.fixture(scope="module")
def runner() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("forkrun.py"))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    yield proc
    proc.stdin.close()
    proc.wait(timeout=30)


def _run_python(runner: subprocess.Popen, block: Block, cwd: Path, log: Path) -> int:
    code = "\n" * block.line + block.code  # so a traceback's line numbers are the page's
    runner.stdin.write(
        json.dumps(
            {
                "code": code,
                "name": str(block.page.relative_to(ROOT)),
                "cwd": str(cwd),
                "log": str(log),
                "timeout": EXAMPLE_TIMEOUT_S,
            }
        )
        + "\n"
    )
    runner.stdin.flush()
    return json.loads(runner.stdout.readline())["rc"]


def _run_bash(block: Block, cwd: Path, log: Path) -> int:
    env = {**os.environ, "HOME": str(cwd / "home"), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    with log.open("w") as f:
        try:
            return subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block.code],
                cwd=cwd,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=EXAMPLE_TIMEOUT_S,
            ).returncode
        except subprocess.TimeoutExpired:
            return -9


RUNNABLE = [p for p in PAGES if to_run(p)]


@pytest.mark.parametrize("page", RUNNABLE, ids=[str(p.relative_to(ROOT)) for p in RUNNABLE])
def test_page_examples_run(page: Path, example_data: Path, runner: subprocess.Popen, tmp_path: Path) -> None:
    """The page's runnable blocks, in order, in a fresh copy of the example data; each exits 0."""
    work = tmp_path / "work"
    shutil.copytree(example_data, work, symlinks=True)
    for n, block in enumerate(to_run(page)):
        log = tmp_path / f"block{n}.log"
        if block.lang == "python":
            rc = _run_python(runner, block, work, log)
        else:
            rc = _run_bash(block, work, log)
        assert rc == 0, f"{block.where} ({block.lang}) exited {rc}:\n{log.read_text()[-4000:]}"


def test_the_readme_quick_start_prints_its_progress(example_data: Path, runner: subprocess.Popen, tmp_path: Path):
    """The Quick start's training says what it does: a line per epoch with its batches and mean
    loss, and, run again, where it resumes (as the README shows)."""
    text = (ROOT / "README.md").read_text()
    start = text.index("## Quick start")
    first = text[:start].count("\n") + 1
    last = first + text[start:].split("\n## ")[0].count("\n")
    quick = [b for b in to_run(ROOT / "README.md") if first <= b.line <= last]
    assert [b.lang for b in quick] == ["python", "bash", "python"]
    work = tmp_path / "work"
    shutil.copytree(example_data, work, symlinks=True)
    logs = []
    for n, block in enumerate([*quick, quick[-1]]):  # the training block twice: the second resumes
        log = tmp_path / f"block{n}.log"
        rc = _run_python(runner, block, work, log) if block.lang == "python" else _run_bash(block, work, log)
        assert rc == 0, log.read_text()[-4000:]
        logs.append(log.read_text())
    epoch_line = re.compile(r"^epoch (\d): (\d+) batches, mean loss \d+\.\d{3}$", re.M)
    epochs = [(int(e), int(b)) for e, b in epoch_line.findall(logs[2])]
    assert [e for e, _ in epochs] == [0, 1, 2] and len({b for _, b in epochs}) == 1 and epochs[0][1] > 0, logs[2]
    shown = re.search(r"```text\n(epoch 0:.*?)```", text, re.S)
    assert shown is not None and len(epoch_line.findall(shown[1])) == 3  # the README shows that output
    resumed = re.search(r"^resuming epoch 2 after its batch (\d+) \(ckpt\.pt\)$", logs[3], re.M)
    assert resumed is not None, logs[3]
    rest = re.search(r"^epoch 2: (\d+) batches", logs[3], re.M)  # the epoch's rest, each batch once
    assert rest is not None and int(resumed[1]) + int(rest[1]) == epochs[2][1], logs[3]
