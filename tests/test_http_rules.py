"""The HTTP rules the stores share, as pure functions: which proxy a URL goes through (the
environment as curl and requests read it, NO_PROXY included), a Content-Encoding undone,
and a served manifest's charset."""

from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

import asyncloader as al
from asyncloader._stores._http import proxy_for
from asyncloader._stores._http_objects import decoded, whole_answer
from asyncloader._stores._web import _as_utf8

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


def test_the_environment_s_proxy_by_scheme(no_proxies: pytest.MonkeyPatch) -> None:
    assert proxy_for("https://bucket.s3.amazonaws.com/k") is None
    no_proxies.setenv("HTTPS_PROXY", "http://p:3128")
    no_proxies.setenv("http_proxy", "http://plain:8080")
    assert proxy_for("https://bucket.s3.amazonaws.com/k") == "http://p:3128"
    assert proxy_for("http://minio.lan:9000/b") == "http://plain:8080"
    # A store option wins; "" means none.
    assert proxy_for("https://x.example/k", "http://other:1") == "http://other:1"
    assert proxy_for("https://x.example/k", "") is None


@pytest.mark.parametrize(
    ("no_proxy", "url", "bypassed"),
    [
        ("*", "https://anything.example/k", True),
        ("example.com", "https://example.com/k", True),
        ("example.com", "https://data.example.com/k", True),
        (".example.com", "https://data.example.com/k", True),
        ("example.com", "https://notexample.com/k", False),
        ("10.0.0.0/8", "http://10.1.2.3:9000/b", True),
        ("10.0.0.0/8", "http://11.1.2.3:9000/b", False),
        ("127.0.0.1", "http://127.0.0.1:9000/b", True),
        ("minio.lan:9000", "http://minio.lan:9000/b", True),
        ("minio.lan:9000", "http://minio.lan:9001/b", False),
        (" localhost , .invalid ", "http://data.invalid:1/b", True),
        ("", "http://data.invalid:1/b", False),
    ],
)
def test_no_proxy_as_curl_reads_it(
    no_proxies: pytest.MonkeyPatch, no_proxy: str, url: str, bypassed: bool
) -> None:
    no_proxies.setenv("ALL_PROXY", "http://p:3128")
    no_proxies.setenv("NO_PROXY", no_proxy)
    assert (proxy_for(url) is None) == bypassed


@given(st.binary(max_size=4096), st.sampled_from(["gzip", "x-gzip", "deflate", "raw-deflate"]))
def test_a_compressed_answer_is_undone(data: bytes, how: str) -> None:
    if how in ("gzip", "x-gzip"):
        body = gzip.compress(data)
    elif how == "deflate":
        body = zlib.compress(data)
    else:  # raw deflate, as some servers send for "deflate"
        packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        body = packer.compress(data) + packer.flush()
    coding = "deflate" if how == "raw-deflate" else how
    assert bytes(decoded(body, {"content-encoding": coding}, what="o", key="o")) == data


def test_encodings_as_they_are_or_refused() -> None:
    assert decoded(b"abc", {}, what="o", key="o") == b"abc"
    assert decoded(b"abc", {"content-encoding": "identity"}, what="o", key="o") == b"abc"
    with pytest.raises(al.StoreError, match="Content-Encoding: br"):
        decoded(b"abc", {"content-encoding": "br"}, what="o", key="o")
    with pytest.raises(al.TransientStoreError, match="does not decompress"):
        decoded(gzip.compress(b"x" * 100)[:20], {"content-encoding": "gzip"}, what="o", key="o")


def test_a_manifest_in_the_charset_its_server_names() -> None:
    text = '{"key": "café/1.jpg"}\n'
    latin = text.encode("latin-1")
    assert _as_utf8(latin, {"content-type": "text/plain; charset=ISO-8859-1"}) == text.encode()
    assert _as_utf8(text.encode(), {"content-type": "application/json"}) == text.encode()
    with pytest.raises(al.StoreError, match="does not decode"):
        _as_utf8(b"\xff", {"content-type": "text/plain; charset=no-such-charset"})


@given(st.integers(1, 4096), st.integers(0, 4096), st.integers(1, 4096))
def test_a_whole_answer_is_told_from_a_part(size: int, start: int, length: int) -> None:
    start = min(start, size - 1)
    end = min(start + length, size)
    assert not whole_answer(b"x" * (end - start), start, end, size)  # the part asked for
    assert whole_answer(b"x" * size, start, end, size) == (end - start != size)
    assert not whole_answer(b"x" * size, 0, None, size)  # no range asked: no whole answer
