"""The converter's progress bar: samples written (with MB/s), fed from the driver as workers report."""

from __future__ import annotations

import time
from typing import Any

from shardify.progress import progress_bar

__all__ = ["ProgressBar"]


class ProgressBar:
    """A tqdm bar of samples (with MB/s) that can be fed from many processes."""

    def __init__(self, *, total: int | None, desc: str, enabled: bool, done: int = 0, done_bytes: int = 0) -> None:
        self.start = time.monotonic()
        self.base_bytes = done_bytes
        self.bar: Any = None
        # shardify's one bar: shown only on a terminal's stderr
        self.bar = progress_bar(total=total, initial=done, desc=desc, unit=" samples", enabled=enabled)
        self.samples = done
        self.nbytes = done_bytes

    def set(self, samples: int, nbytes: int) -> None:
        if self.bar is None:
            self.samples, self.nbytes = samples, nbytes
            return
        if samples != self.samples:
            self.bar.update(samples - self.samples)
            self.samples = samples
        self.nbytes = nbytes
        elapsed = max(time.monotonic() - self.start, 1e-6)
        self.bar.set_postfix_str(f"{(nbytes - self.base_bytes) / elapsed / 1e6:.1f} MB/s", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
