"""A small HTTP server for tests and benchmarks, on 127.0.0.1: serves a folder with ``Range``
support (``bytes=a-b`` and ``bytes=a-``; many ranges ``bytes=a-b,c-d`` answered with a
``206 multipart/byteranges`` body, or as ``multi_range`` says), counts the requests, connections and body bytes it
sends, can misbehave on purpose (ignore Range, answer a shorter range, drop the connection
mid-body, close it after every answer, send a wrong or no Content-Range, trickle the body,
stall after the headers or part of the body, trickle the status line and headers, answer an
error status with ``Retry-After``, send more bytes than the file, answer 200 with an HTML
page), redirect paths, or add a delay before every answer. Faults apply to the first
``faults_left`` GETs (None: all) of the paths ending with one of ``fault_paths`` (empty:
every path) and none of ``clean_paths``."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["Behaviour", "serve"]

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
_ONE = re.compile(r"\s*(\d+)-(\d*)\s*")
_LIST = re.compile(r"\s*\d+-\d*\s*(?:,\s*\d+-\d*\s*)*")
BOUNDARY = "rangeserver-3d6f0a1c9b"
MULTI_RANGE = ("answer", "whole", "first", "merge", "coalesce", "shuffle")


@dataclass
class Behaviour:
    """What the server does; ``sent`` and ``gets`` count body bytes and GETs since :meth:`reset`."""

    delay_s: float = 0.0
    ignore_range: bool = False  # answer 200 with the whole file
    short: int = 0  # answer a Range request with this many bytes fewer (honest Content-Range)
    drop_after: int | None = None  # close the connection after this many body bytes (every GET)
    faults_left: int | None = None  # how many GETs misbehave (None: all)
    wrong_range: int = 0  # Content-Range says the range starts this many bytes later than it does
    close_after: str = ""  # close the connection after every answer: "silently" or "announced" (Connection: close)
    redirects: dict[str, tuple[int, str]] = field(default_factory=dict)  # path -> (status, Location)
    trickle_bps: int = 0  # send the body at this many bytes per second
    header_bps: int = 0  # send the status line and headers at this many bytes per second
    stall_at: float | None = None  # send this fraction of the body (0: only the headers), then nothing
    error_status: int = 0  # answer with this status (429, 503, 500...) and no body
    retry_after: str = ""  # the Retry-After header of an error answer (seconds or an HTTP-date)
    extra_body: int = 0  # send this many bytes past the file's end
    no_length: bool = False  # no Content-Length (the body ends when the connection closes)
    no_content_range: bool = False  # answer 206 without Content-Range
    html_200: bool = False  # answer 200 with an HTML error page
    # a request for many ranges: "answer" (multipart/byteranges), "whole" (200 with the whole file),
    # "first" (a single-part 206 of the first range), "merge" (a single-part 206 from the first
    # range's start to the last's end), "coalesce" (multipart, ranges less than coalesce_gap bytes
    # apart merged into one part), "shuffle" (multipart, parts in reverse order); not a fault
    multi_range: str = "answer"
    coalesce_gap: int = 4096
    part_lies: int = 0  # a multipart part's Content-Range claims this many bytes more than it holds
    fault_paths: tuple[str, ...] = ()  # faults only for paths ending so (empty: all)
    clean_paths: tuple[str, ...] = ()  # never faults for paths ending so
    stopped: threading.Event = field(default_factory=threading.Event)  # set when the server stops
    connections: int = 0  # connections accepted
    open: int = 0  # connections open now
    sent: int = 0
    gets: int = 0
    active: int = 0
    most_active: int = 0  # the most GETs answered at once
    paths: list[str] = field(default_factory=list)  # the path of every GET, in order
    sent_by_path: dict[str, int] = field(default_factory=dict)  # body bytes sent, per path
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.sent = self.gets = self.most_active = self.connections = 0
            self.paths.clear()
            self.sent_by_path.clear()

    def _faulty(self, rel: str) -> bool:
        if (self.fault_paths and not rel.endswith(self.fault_paths)) or (
            self.clean_paths and rel.endswith(self.clean_paths)
        ):
            return False
        with self.lock:
            if self.faults_left is None:
                return True
            if self.faults_left > 0:
                self.faults_left -= 1
                return True
            return False


class _Handler(BaseHTTPRequestHandler):
    timeout = 10
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # the headers and the body's two parts go out as written: with
    # Nagle, the last small write waited for the client's delayed ACK, 40 ms a request on loopback

    def log_message(self, *args: Any) -> None:
        pass

    def handle(self) -> None:
        b: Behaviour = self.server.behaviour  # type: ignore[attr-defined]
        with b.lock:
            b.connections += 1
            b.open += 1
        try:
            super().handle()
        finally:
            with b.lock:
                b.open -= 1

    def do_GET(self) -> None:
        b: Behaviour = self.server.behaviour  # type: ignore[attr-defined]
        with b.lock:
            b.active += 1
            b.most_active = max(b.most_active, b.active)
        self._counted = True
        try:
            self._answer(b)
        finally:
            self._finished(b)

    def _finished(self, b: Behaviour) -> None:
        """This GET no longer counts as active (once, before its last byte leaves: a client that
        has the whole answer may send its next request at once, and that one must not overlap)."""
        if self._counted:
            self._counted = False
            with b.lock:
                b.active -= 1

    def _answer(self, b: Behaviour) -> None:
        if b.delay_s:
            time.sleep(b.delay_s)
        rel = unquote(urlsplit(self.path).path).lstrip("/")
        self._faulty_now = False
        with b.lock:
            b.paths.append(rel)
        if b.close_after:
            self.close_connection = True
        if rel in b.redirects:
            status, location = b.redirects[rel]
            self.send_response(status)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self._end_headers(b)
            return
        path = (self.server.root / rel).resolve()  # type: ignore[attr-defined]
        if not path.is_file() or self.server.root.resolve() not in path.parents:  # type: ignore[attr-defined]
            self.send_error(404)
            return
        total = path.stat().st_size
        m = _RANGE.fullmatch(self.headers.get("Range", "").strip())
        faulty = self._faulty_now = b._faulty(rel)
        if faulty and (b.error_status or b.html_200):
            self._error(b)
            return
        many = _many_ranges(self.headers.get("Range", ""), total) if m is None else None
        if many is not None and len(many) > 1 and not (faulty and b.ignore_range):
            self._many(b, path, rel, total, many, faulty)
            return
        if m is None or (faulty and b.ignore_range):
            status, start, stop = 200, 0, total
        else:
            start = int(m.group(1))
            stop = min(total, int(m.group(2)) + 1 if m.group(2) else total)
            if faulty and b.short:
                stop = max(start, stop - b.short)
            status = 206
        with open(path, "rb") as f:  # only the bytes asked for
            f.seek(start)
            body = f.read(stop - start)
        self.send_response(status)
        if not (faulty and b.no_length):
            self.send_header("Content-Length", str(len(body)))
        else:
            self.close_connection = True
        if status == 206 and not (faulty and b.no_content_range):
            shift = b.wrong_range if faulty else 0
            self.send_header("Content-Range", f"bytes {start + shift}-{stop - 1 + shift}/{total}")
        self._end_headers(b)
        self._body(b, rel, body, faulty)

    def _body(self, b: Behaviour, rel: str, body: bytes, faulty: bool) -> None:
        """Send ``body`` (after the body faults when ``faulty``), counted; the GET stops counting
        as active before its last byte."""
        if faulty:
            body = self._faulty_body(b, body)
        self.wfile.write(memoryview(body)[:-1])
        with b.lock:
            b.sent += len(body)
            b.gets += 1
            b.sent_by_path[rel] = b.sent_by_path.get(rel, 0) + len(body)
        self._finished(b)
        if body:
            self.wfile.write(body[-1:])

    def _many(
        self, b: Behaviour, path: Path, rel: str, total: int, ranges: list[tuple[int, int]], faulty: bool
    ) -> None:
        """The answer to a request for many ranges, as ``b.multi_range`` says; the bytes read
        from one open file, a ``pread`` per range."""
        if b.multi_range == "whole":
            self._whole(b, path, rel, total)
            return
        if b.multi_range == "first":
            ranges = ranges[:1]
        elif b.multi_range == "merge":
            ranges = [(ranges[0][0], max(stop for _, stop in ranges))]
        elif b.multi_range == "coalesce":
            ranges = _coalesced(ranges, b.coalesce_gap)
        with open(path, "rb", buffering=0) as f:
            fd = f.fileno()
            chunks = [os.pread(fd, stop - start, start) for start, stop in ranges]
        shift = b.wrong_range if faulty else 0
        self.send_response(206)
        if len(ranges) == 1:
            (start, stop), body = ranges[0], chunks[0]
            if not (faulty and b.no_content_range):
                self.send_header("Content-Range", f"bytes {start + shift}-{stop - 1 + shift}/{total}")
        else:
            pieces = []
            order = range(len(ranges) - 1, -1, -1) if b.multi_range == "shuffle" else range(len(ranges))
            head = f"--{BOUNDARY}\r\nContent-Type: application/x-tar\r\nContent-Range: bytes ".encode()
            lies = b.part_lies if faulty else 0
            for i in order:
                (start, stop), data = ranges[i], chunks[i]
                pieces += [head, b"%d-%d/%d\r\n\r\n" % (start + shift, stop - 1 + shift + lies, total), data, b"\r\n"]
            body = b"".join([*pieces, f"--{BOUNDARY}--\r\n".encode()])
            self.send_header("Content-Type", f"multipart/byteranges; boundary={BOUNDARY}")
        if not (faulty and b.no_length):
            self.send_header("Content-Length", str(len(body)))
        else:
            self.close_connection = True
        self._end_headers(b)
        self._body(b, rel, body, faulty)

    def _whole(self, b: Behaviour, path: Path, rel: str, total: int) -> None:
        """200 with the whole file, sent a chunk at a time and counted as sent (a client that
        closes the connection stops it)."""
        self.send_response(200)
        self.send_header("Content-Length", str(total))
        self._end_headers(b)
        with b.lock:
            b.gets += 1
        self._finished(b)
        with open(path, "rb") as f:
            while chunk := f.read(1 << 16):
                self.wfile.write(chunk)
                with b.lock:
                    b.sent += len(chunk)
                    b.sent_by_path[rel] = b.sent_by_path.get(rel, 0) + len(chunk)

    def _error(self, b: Behaviour) -> None:
        """An error status (with Retry-After) or an HTML page with 200, instead of the file."""
        page = b"<html><body>Service unavailable, try later</body></html>" if b.html_200 else b""
        self.send_response(200 if b.html_200 else b.error_status)
        self.send_header("Content-Length", str(len(page)))
        if b.html_200:
            self.send_header("Content-Type", "text/html")
        if b.retry_after:
            self.send_header("Retry-After", b.retry_after)
        self._end_headers(b)
        self.wfile.write(page)

    def _faulty_body(self, b: Behaviour, body: bytes) -> bytes:
        """What is left to send of ``body`` after the body faults (trickled and stalled parts are sent here)."""
        if b.drop_after is not None:
            body = body[: b.drop_after]
            self.close_connection = True
        if b.extra_body:
            body += b"\0" * b.extra_body
            self.close_connection = True
        if b.stall_at is not None:
            self._send_slowly(b, body[: int(len(body) * b.stall_at)])
            b.stopped.wait()  # hold the connection, sending nothing, until the server stops
            self.close_connection = True
            return b""
        if b.trickle_bps:
            self._send_slowly(b, body[:-1])
            return body[-1:]
        return body

    def _send_slowly(self, b: Behaviour, data: bytes) -> None:
        """``data`` at ``trickle_bps`` bytes per second (at once without it)."""
        self._trickle(b, data, b.trickle_bps)

    def _trickle(self, b: Behaviour, data: bytes, bps: int) -> None:
        """``data`` at ``bps`` bytes per second, a tenth of a second's worth at a time (at once
        when ``bps`` is 0); stops with the server."""
        if not bps:
            self.wfile.write(data)
            self.wfile.flush()
            return
        step = max(1, bps // 10)
        for i in range(0, len(data), step):
            if b.stopped.wait(step / bps):
                raise ConnectionAbortedError("the server stopped")
            self.wfile.write(data[i : i + step])
            self.wfile.flush()

    def _end_headers(self, b: Behaviour) -> None:
        if b.close_after == "announced":
            self.send_header("Connection", "close")
        if not (self._faulty_now and b.header_bps):
            self.end_headers()
            return
        head = b"".join(self._headers_buffer) + b"\r\n"  # type: ignore[attr-defined]
        self._headers_buffer = []  # type: ignore[attr-defined]
        self._trickle(b, head, b.header_bps)


def _many_ranges(header: str, total: int) -> list[tuple[int, int]] | None:
    """The ``(start, stop)`` ranges of ``Range: bytes=a-b,c-d,...`` that the file holds (ends
    clipped to its size, in the order asked); None when the header is not such a list."""
    if not header.startswith("bytes=") or _LIST.fullmatch(header, len("bytes=")) is None:
        return None
    ranges = []
    for a, b in _ONE.findall(header, len("bytes=")):
        start, stop = int(a), min(total, int(b) + 1 if b else total)
        if start < stop:
            ranges.append((start, stop))
    return ranges


def _coalesced(ranges: list[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """``ranges`` (sorted) with those less than ``gap`` bytes apart merged into one."""
    out = [ranges[0]]
    for start, stop in ranges[1:]:
        if start - out[-1][1] < gap:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many requests in flight: the default backlog of 5 drops connections

    def __init__(self, root: Path, behaviour: Behaviour) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root, self.behaviour = root, behaviour

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up mid-answer (as tests of deadlines and aborts do) is no error."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


@contextmanager
def serve(root: str | Path, behaviour: Behaviour | None = None) -> Iterator[tuple[str, Behaviour]]:
    """``(base URL, behaviour)`` of a server for the files under ``root``, stopped on exit."""
    b = behaviour or Behaviour()
    httpd = _Server(Path(root), b)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    b.stopped.clear()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", b
    finally:
        b.stopped.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@contextmanager
def serve_process(root: str | Path, *, delay_s: float = 0.0) -> Iterator[str]:
    """The base URL of a server for the files under ``root`` in a process of its own (as a real
    server would be: its work does not share this process's interpreter lock), each answer
    delayed ``delay_s``; stopped on exit."""
    import subprocess

    argv = [sys.executable, __file__, str(root), "--delay-ms", str(delay_s * 1000)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        base = proc.stdout.readline().strip()
        if not base.startswith("http://"):
            raise RuntimeError(f"rangeserver did not start: {base!r}")
        yield base
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    """``python tools/rangeserver.py ROOT [--delay-ms 50]``: serve ROOT until killed; prints the base URL."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("root", type=Path)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    with serve(args.root, Behaviour(delay_s=args.delay_ms / 1000)) as (base, _):
        print(base, flush=True)
        try:
            sys.stdin.read()  # until the parent closes stdin
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
