"""The Range header for many spans and the multipart/byteranges body that answers it
(shardify.multirange): pure functions, over hand-written and random bodies."""

from __future__ import annotations

import random

import pytest

from shardify.multirange import (
    MAX_RANGE_HEADER_BYTES,
    MultipartError,
    TruncatedMultipart,
    boundary_of,
    check_spans,
    cut_spans,
    describe_spans,
    header_bytes,
    parse_parts,
    range_header,
    split_spans,
)

DATA = bytes(random.Random(0).randbytes(20000))


def _body(parts: list[tuple[int, int]], *, boundary: str = "B0UND", nl: str = "\r\n", total: str = "20000") -> bytes:
    """A multipart/byteranges body of ``DATA``'s ``(start, stop)`` parts, lines ending in ``nl``."""
    out = b""
    for a, b in parts:
        head = f"--{boundary}{nl}Content-Type: application/x-tar{nl}Content-Range: bytes {a}-{b - 1}/{total}{nl}{nl}"
        out += head.encode()
        out += DATA[a:b] + nl.encode()
    return out + f"--{boundary}--{nl}".encode()


def _got(parts) -> list[tuple[int, bytes, int | None]]:
    return [(p.start, bytes(p.data), p.total) for p in parts]


@pytest.mark.parametrize(
    "content_type, boundary",
    [
        pytest.param("multipart/byteranges; boundary=abc123", "abc123", id="bare"),
        pytest.param('multipart/byteranges; boundary="a b:c"', "a b:c", id="quoted"),
        pytest.param('multipart/byteranges;boundary="x\\"y"', 'x"y', id="quoted-escape"),
        pytest.param("Multipart/ByteRanges; charset=x; BOUNDARY=zz", "zz", id="case-and-other-params"),
        pytest.param("multipart/byteranges", None, id="no-boundary"),
        pytest.param("multipart/mixed; boundary=abc", None, id="another-multipart"),
        pytest.param("application/octet-stream", None, id="not-multipart"),
        pytest.param(None, None, id="none"),
    ],
)
def test_the_boundary_is_read_from_the_content_type(content_type, boundary):
    assert boundary_of(content_type) == boundary


@pytest.mark.parametrize("nl", ["\r\n", "\n"], ids=["crlf", "lf"])
def test_parts_are_read_in_the_order_sent_with_either_line_end(nl):
    spans = [(5000, 5100), (0, 1), (19999, 20000)]
    parts = parse_parts(_body(spans, nl=nl), "B0UND")
    assert _got(parts) == [(a, DATA[a:b], 20000) for a, b in spans]


def test_a_preamble_an_epilogue_and_transport_padding_are_ignored():
    body = _body([(10, 20), (30, 40)]).replace(b"--B0UND\r\n", b"--B0UND  \t\r\n", 1)
    body = b"This is a preamble\r\nof two lines\r\n" + body + b"an epilogue\r\n--B0UND\r\nnot a part"
    assert _got(parse_parts(body, "B0UND")) == [(10, DATA[10:20], 20000), (30, DATA[30:40], 20000)]


def test_a_part_holding_text_like_the_boundary_is_read_by_its_length():
    """A part's bytes are jumped over by its Content-Range, never searched for the boundary."""
    global DATA
    saved, DATA = DATA, DATA[:100] + b"\r\n--B0UND\r\n" + DATA[111:]
    try:
        assert _got(parse_parts(_body([(90, 130)]), "B0UND")) == [(90, DATA[90:130], 20000)]
    finally:
        DATA = saved


def test_an_unknown_total_is_none_and_headers_are_case_blind():
    body = _body([(1, 3)], total="*").replace(b"Content-Range", b"content-RANGE")
    assert _got(parse_parts(body, "B0UND")) == [(1, DATA[1:3], None)]


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda b: b[: -len(b"--B0UND--\r\n")], id="no-closing-boundary"),
        pytest.param(lambda b: b[: -len(b"--\r\n")], id="closing-boundary-cut"),
        pytest.param(lambda b: b[:-20], id="mid-part"),
        pytest.param(lambda b: b[:60], id="mid-headers"),
        pytest.param(lambda b: b[: b.index(b"\r\n\r\n") + 4 + 100], id="part-data-cut-at-its-end"),
        pytest.param(lambda b: b[: b.index(b"\r\n\r\n") + 4 + 102], id="after-a-part"),
        pytest.param(lambda b: b"", id="empty"),
        pytest.param(lambda b: b"--B0UND", id="a-boundary-alone"),
    ],
)
def test_a_body_that_ends_too_soon_is_truncated(cut):
    body = cut(_body([(0, 100), (200, 300)]))
    with pytest.raises(TruncatedMultipart):
        parse_parts(body, "B0UND")


@pytest.mark.parametrize(
    "change, why",
    [
        pytest.param(lambda b: b.replace(b"bytes 0-99/", b"bytes 0-97/"), "longer or shorter", id="part-longer"),
        pytest.param(lambda b: b.replace(b"bytes 0-99/", b"bytes 0-101/"), "longer or shorter", id="part-shorter"),
        pytest.param(lambda b: b.replace(b"Content-Range: bytes 0-99/20000\r\n", b""), "without", id="no-range"),
        pytest.param(lambda b: b.replace(b"bytes 0-99/", b"bytes 99-0/"), "Content-Range", id="backwards"),
        pytest.param(lambda b: b.replace(b"bytes 0-99/", b"items 0-99/"), "Content-Range", id="not-bytes"),
        pytest.param(lambda b: b.replace(b"--B0UND\r\n", b"--B0UNDx\r\n", 1), "followed by", id="other-boundary"),
        pytest.param(lambda b: b"--B0UND--\r\n", "without parts", id="no-parts"),
    ],
)
def test_a_wrong_body_is_refused_not_truncated(change, why):
    body = change(_body([(0, 100), (200, 300)]))
    with pytest.raises(MultipartError, match=why) as e:
        parse_parts(body, "B0UND")
    assert not isinstance(e.value, TruncatedMultipart)


def _parts(spans):
    return parse_parts(_body(spans), "B0UND")


def test_spans_are_cut_from_coalesced_and_shuffled_parts():
    spans = [(0, 10), (10, 20), (25, 30), (100, 200), (150 + 50, 201), (5000, 6000)]
    parts = _parts([(5000, 6000), (0, 30), (100, 201)])
    assert cut_spans(parts, spans) == [DATA[a:b] for a, b in spans]


def test_a_span_covered_only_by_an_earlier_overlapping_part_is_found():
    parts = _parts([(0, 1000), (500, 600)])
    assert cut_spans(parts, [(550, 700)]) == [DATA[550:700]]


@pytest.mark.parametrize(
    "spans",
    [
        pytest.param([(0, 10), (300, 301)], id="between-parts"),
        pytest.param([(95, 105)], id="past-a-parts-end"),
        pytest.param([(0, 10), (2000, 2001)], id="past-the-last-part"),
    ],
)
def test_a_span_no_part_covers_is_named(spans):
    with pytest.raises(MultipartError, match=f"bytes {spans[-1][0]}-{spans[-1][1] - 1}"):
        cut_spans(_parts([(0, 100), (200, 300)]), spans)


def test_parts_that_disagree_on_the_files_size_are_refused():
    body = _body([(0, 10), (20, 30)]).replace(b"20-29/20000", b"20-29/20001")
    with pytest.raises(MultipartError, match="disagree"):
        cut_spans(parse_parts(body, "B0UND"), [(0, 10)])


def test_random_bodies_give_back_every_span():
    rng = random.Random(1)
    for _ in range(200):
        cuts = sorted(rng.sample(range(20001), 2 * rng.randint(1, 40)))
        spans = list(zip(cuts[::2], cuts[1::2], strict=True))
        spans = [(a, b) for a, b in spans if b > a]
        sent = list(spans)
        rng.shuffle(sent)
        assert cut_spans(_parts(sent), spans) == [DATA[a:b] for a, b in spans]


@pytest.mark.parametrize(
    "spans",
    [
        pytest.param([], id="none"),
        pytest.param([(5, 5)], id="empty-span"),
        pytest.param([(6, 5)], id="backwards"),
        pytest.param([(-1, 5)], id="negative"),
        pytest.param([(10, 20), (0, 5)], id="unsorted"),
        pytest.param([(0, 10), (9, 20)], id="overlapping"),
    ],
)
def test_bad_spans_are_refused(spans):
    with pytest.raises(ValueError):
        check_spans(spans)
    with pytest.raises(ValueError):
        split_spans(spans)


def test_the_range_header_and_its_length():
    spans = [(0, 10), (100, 101), (123456, 200000)]
    assert range_header(spans) == "bytes=0-9,100-100,123456-199999"
    assert header_bytes(spans) == len(f"Range: {range_header(spans)}")
    assert describe_spans(spans, shown=2) == "3 ranges, bytes 0-9, 100-100, ..."
    assert describe_spans(spans[:1]) == "1 ranges, bytes 0-9"


@pytest.mark.parametrize("limit", [40, 100, 1000, MAX_RANGE_HEADER_BYTES])
def test_split_spans_groups_fit_the_header_and_join_back(limit):
    rng = random.Random(limit)
    for n in (1, 2, 50, 1000):
        starts = sorted(rng.sample(range(10**12), n))
        spans = [(a, a + rng.randint(1, 10**6)) for a in starts]
        spans = [s for i, s in enumerate(spans) if i == 0 or s[0] >= spans[i - 1][1]]
        groups = split_spans(spans, max_header_bytes=limit)
        assert [s for g in groups for s in g] == spans
        assert all(g and header_bytes(g) <= limit for g in groups)
        # each group is as long as it can be: the next span would not have fitted
        assert all(header_bytes([*g, nxt[0]]) > limit for g, nxt in zip(groups, groups[1:], strict=False))


def test_split_spans_refuses_a_limit_below_one_span():
    with pytest.raises(ValueError, match="max_header_bytes"):
        split_spans([(10**9, 10**10)], max_header_bytes=20)


def test_split_spans_fills_a_group_to_the_byte():
    spans = [(0, 10), (20, 30), (40, 50)]
    line = len("Range: bytes=0-9,20-29,40-49")
    assert header_bytes(spans) == line
    assert split_spans(spans, max_header_bytes=line) == [spans]
    assert split_spans(spans, max_header_bytes=line - 1) == [spans[:2], spans[2:]]
