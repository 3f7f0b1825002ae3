"""Device prefetch: the next batch is copied and normalised while the current one is in use.

On CUDA the copy runs on a side stream from pinned memory (``non_blocking=True``); before a
batch is handed out, the consumer's stream waits for it, and every tensor is
``record_stream``-ed on the consumer's stream so the caching allocator does not reuse its
memory while work queued there may still read it. Image batches (uint8, ``N x C x H x W``
with ``C == len(mean)``) become ``dtype`` and are normalised on the device; other tensors
are only moved. Without CUDA the same code runs with no stream (tested on the CPU).

With ``decode``, an :class:`~shardify.reader.sample.device_prep.EncodedBatch` (from a dataset
with ``DecodeOptions(device=...)``) is decoded and augmented on the device by ``decode`` (a
:class:`~shardify.reader.sample.device_decode.DeviceDecoder`), then normalised like any image
batch. That work runs in a thread of its own (``shardify-decode``), on the side stream, up to
:data:`DECODE_AHEAD` batches ahead of the one the training loop holds: nvJPEG's batched call
(torchvision's ``decode_jpeg``) returns only when the batch is decoded (it synchronises its
stream), and the crop and resize launch a few hundred small copies. In the training loop's
thread that would stall the launch of the next step for the whole decode; in its own thread
(torch releases the GIL inside the call) the step goes on while the next batches decode. The
main thread alone takes batches from the DataLoader (its iterator is not thread-safe) and
hands them to the decode thread in order; each decoded batch comes back with a CUDA event
that the consumer's stream waits on. An error in the decode thread is raised in the training
loop at the batch it belongs to; leaving the loop early stops the thread: the batches not begun
are dropped and the one it is decoding is waited for at most :data:`STOP_WAIT_S` (the thread is a
daemon, never joined at interpreter exit: a decode that hangs cannot hold the process).

A :class:`~shardify.reader.stages.base.Stage`: its state is ``{"yielded": n, "source": ...}``,
the batches handed out and its source's state as it was when the last of them was taken from it
(the batches prepared ahead are not counted: a restore prepares them again). A source that is not
a stage (a DataLoader's iterator) has no state to restore: the first ``n`` batches it gives are
then passed over, unprepared.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import torch

from shardify.reader.delivery.stats import MainClock
from shardify.reader.sample.device_decode import fill_rows
from shardify.reader.sample.prepared import EncodedBatch
from shardify.reader.stages.base import Stage, load_source_state, source_state

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DECODE_AHEAD",
    "STOP_WAIT_S",
    "DecodeThread",
    "DevicePrefetcher",
    "resolve_device",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DECODE_AHEAD = 2
"""Batches the decode thread may have decoded, or be decoding, beyond the one in use."""
STOP_WAIT_S = 2.0
"""How long stopping waits for the batch the decode thread is decoding; past it, the thread (a
daemon) is left to finish alone, so that a decode that hangs (a device that does not answer) never
holds the loop's exit or the process's."""
_END = object()

Decode = Callable[[EncodedBatch], tuple[torch.Tensor, torch.Tensor | None]]


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` with its index: ``"cuda"`` is this thread's current CUDA device, named, so the
    decode thread (whose current device is 0 until set) uses the same one under DDP."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


class DecodeThread:
    """The ``shardify-decode`` thread: runs the calls submitted to it, in order, each as a Future.

    A daemon thread of its own, not a ThreadPoolExecutor's: the executor's threads are joined at
    interpreter exit and by ``shutdown(wait=True)``, so a decode that never returns would hold the
    process. :meth:`stop` cancels what has not started and waits at most :data:`STOP_WAIT_S`.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name="shardify-decode", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._jobs.put((future, fn, args))
        return future

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - raised in the loop, at its batch
                future.set_exception(e)
            del future, fn, args, job  # the batch is the loop's now: hold no reference to it

    def stop(self, wait_s: float = STOP_WAIT_S) -> bool:
        """End the thread after the call under way (those not started are cancelled by their owner);
        wait for it at most ``wait_s``. True when it ended."""
        self._jobs.put(None)
        self._thread.join(timeout=wait_s)
        return not self._thread.is_alive()


class DevicePrefetcher(Stage[Any]):
    """Iterate ``batches`` moved to ``device``, one batch ahead; see the module docstring."""

    def __init__(
        self,
        batches: Iterable[Any],
        *,
        device: str | torch.device,
        dtype: torch.dtype = torch.float32,
        normalize: bool = True,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        channels_last: bool = False,
        decode: Decode | None = None,
        clock: MainClock | None = None,
    ) -> None:
        if not dtype.is_floating_point:
            raise ValueError(f"{dtype=} should be a floating point dtype")
        if len(mean) != len(std) or not mean or any(s <= 0 for s in std):
            raise ValueError(f"{mean=} and {std=} should have the same length, std > 0")
        self._batches = batches
        self.device = resolve_device(device)
        self._dtype, self._normalize, self._channels_last = dtype, normalize, channels_last
        channels = len(mean)
        shape = (1, channels, 1, 1)
        # (x / 255 - mean) / std  ==  x * scale + shift, computed in float32
        std_t = torch.tensor(std, dtype=torch.float32)
        self._scale = (1.0 / (255.0 * std_t)).reshape(shape).to(self.device)
        self._shift = (-torch.tensor(mean, dtype=torch.float32) / std_t).reshape(shape).to(self.device)
        self._channels = channels
        self._cuda = self.device.type == "cuda"
        self._decode = decode
        self._clock = clock  # gets the host seconds of each batch's copy, or of its device decode
        self._items: Generator[Any, None, None] | None = None
        self.yielded = 0
        self._taken: Any = None  # the source's state when the last batch handed out was taken from it
        self._skip = 0  # batches of a source without state to pass over (restored)

    def _is_image(self, t: torch.Tensor) -> bool:
        return t.dtype == torch.uint8 and t.dim() == 4 and t.shape[1] == self._channels

    def _convert(self, t: torch.Tensor) -> torch.Tensor:
        t = t.to(self.device, non_blocking=True)
        if not self._is_image(t):
            return t
        if self._channels_last:
            t = t.contiguous(memory_format=torch.channels_last)
        x = t.to(torch.float32)
        if self._normalize:
            x = x.mul_(self._scale).add_(self._shift)
        else:
            x = x.div_(255.0)
        return x if self._dtype == torch.float32 else x.to(self._dtype)

    def _apply(self, obj: Any, fn: Any, replaced: list[tuple[torch.Tensor, int]] | None = None) -> Any:
        """``obj`` with ``fn`` applied to each tensor; an EncodedBatch is decoded first, and the
        row order that replaces its bad rows (skip policy) is added to ``replaced``."""
        if isinstance(obj, torch.Tensor):
            return fn(obj)
        if isinstance(obj, EncodedBatch):
            if self._decode is None or replaced is None:
                raise ValueError(
                    "a batch prepared for device decode reached a DevicePrefetcher without decode=...; "
                    "iterate the dataset through make_loader"
                )
            images, rows = self._decode(obj)
            if rows is not None:
                replaced.append((rows, len(obj.keys)))
            return fn(images)
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(self._apply(x, fn, replaced) for x in obj))
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._apply(x, fn, replaced) for x in obj)
        if isinstance(obj, dict):
            return {k: self._apply(v, fn, replaced) for k, v in obj.items()}
        return obj

    def _prepared(self, batch: Any) -> Any:
        """``batch`` on the device: moved, decoded, normalised, bad rows replaced (skip policy)."""
        replaced: list[tuple[torch.Tensor, int]] = []
        out = self._apply(batch, self._convert, replaced)
        if not replaced:
            return out
        for rows, n in replaced:  # one per image column; fill_rows takes every column's rows
            out = fill_rows(out, rows, n)
        return out

    def _prepared_on(self, batch: Any, stream: Any) -> tuple[Any, Any]:
        """``batch`` prepared on ``stream`` (in whichever thread calls this), and the CUDA event
        that marks it done there (None without a stream)."""
        start = time.perf_counter()
        if stream is None:
            out, event = self._prepared(batch), None
        else:
            timed = self._clock is not None and self._decode is not None  # device decode: its device time too
            with torch.cuda.device(self.device), torch.cuda.stream(stream):
                begun = stream.record_event(torch.cuda.Event(enable_timing=True)) if timed else None
                out = self._prepared(batch)
                event = stream.record_event(torch.cuda.Event(enable_timing=timed))
            if timed and self._clock is not None:
                self._clock.add_events(begun, event)  # read once done on the device, never waited for
        if self._clock is not None:
            self._clock.add("copy" if self._decode is None else "device_decode", time.perf_counter() - start)
        return out, event

    def _hand_over(self, batch: Any, event: Any) -> Any:
        """Let the consumer's stream use ``batch`` once ``event`` (its preparation) is done."""
        if event is None:
            return batch
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)
        self._apply(batch, lambda t: t.record_stream(current), [])
        return batch

    def __next__(self) -> Any:
        if self._items is None:
            self._items = self._decoded() if self._decode is not None else self._moved()
        batch = next(self._items)
        self.yielded += 1
        return batch

    def close(self) -> None:
        """Stop: the decode thread (if any) ends once the batch it is decoding is done."""
        if self._items is not None:
            self._items.close()

    def state_dict(self) -> dict[str, Any]:
        taken = self._taken if self.yielded or self._items is not None else source_state(self._batches)
        return {"yielded": self.yielded, "source": taken}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.yielded = int(state["yielded"])
        if state["source"] is not None:
            load_source_state(self._batches, state["source"])
            self._taken = state["source"]
        else:
            self._skip = self.yielded

    def skip(self, n: int) -> None:
        """Hand out the batches after the first ``n``: a stage source skips them itself, the
        batches of another are passed over."""
        self.yielded = n
        if isinstance(self._batches, Stage):
            self._batches.skip(n)
        else:
            self._skip = n

    def _source(self) -> Iterator[tuple[Any, Any]]:
        """``(batch, the source's state just after it)`` from the source, restored batches passed over."""
        it = iter(self._batches)
        for _ in range(self._skip):
            if next(it, _END) is _END:
                return
        self._skip = 0
        for batch in it:
            yield batch, source_state(it)

    def _moved(self) -> Generator[Any, None, None]:
        """Batches with nothing to decode: moved and normalised one ahead, in this thread."""
        it = self._source()
        stream = torch.cuda.Stream(device=self.device) if self._cuda else None

        def preload() -> Any:
            taken = next(it, None)  # a (batch, state) pair, or None at the end
            return _END if taken is None else (*self._prepared_on(taken[0], stream), taken[1])

        upcoming = preload()
        while upcoming is not _END:
            prepared, event, self._taken = upcoming
            batch = self._hand_over(prepared, event)
            upcoming = preload()
            yield batch

    def _decoded(self) -> Generator[Any, None, None]:
        """Batches to decode: decoded in the ``shardify-decode`` thread, :data:`DECODE_AHEAD` ahead."""
        it = self._source()
        stream = torch.cuda.Stream(device=self.device) if self._cuda else None
        pool = DecodeThread()
        pending: deque[tuple[Future[tuple[Any, Any]], Any]] = deque()

        def submit() -> None:
            taken = next(it, None)  # a (batch, state) pair, or None at the end
            if taken is not None:
                pending.append((pool.submit(self._prepared_on, taken[0], stream), taken[1]))

        try:
            for _ in range(DECODE_AHEAD):
                submit()
            while pending:
                future, state = pending.popleft()
                prepared = future.result()
                submit()
                self._taken = state
                yield self._hand_over(*prepared)
        finally:
            for future, _ in pending:
                future.cancel()
            pending.clear()
            pool.stop()
