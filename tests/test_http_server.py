"""Python's own ``http.server`` (``python -m http.server``), a server nobody here wrote:
HTTP/1.0 answers, a connection per request, a listen queue of five."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

import asyncloader as al
from asyncloader.testing import PythonHTTPServer


def _pixels(
    url: str, manifest: Path, cache: Path | None = None
) -> tuple[np.ndarray, np.ndarray, al.Stats]:
    """One epoch; with ``cache``, the next epoch, prefetched while this one ends, reads the
    node's cache, not the server."""
    with al.ImageLoader(
        url,
        labels=str(manifest),
        batch_size=16,
        transform=al.Resize(24),
        shuffle=False,
        # 128 requests in flight at once, none sent twice (the subject is connections).
        fetch=al.FetchConfig(max_inflight=128, adaptive=False, hedge=False),
        engine=al.EngineConfig(mode="inline"),
        cache_dir=cache,
    ) as loader:
        pairs = [(images.numpy().copy(), labels.numpy().copy()) for images, labels in loader]
        stats = loader.stats()
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs]), stats


def test_a_folder_from_python_http_server_streams_every_image_once(
    jpeg_folder: Path, tmp_path: Path
) -> None:
    """Each image by one GET on a connection of its own, 128 wanted at once: the client
    never reuses a connection the server closed and never overflows its listen queue into
    read timeouts (no retry at all), and the pixels are the folder's."""
    files = sorted(p.relative_to(jpeg_folder).as_posix() for p in jpeg_folder.rglob("*.jpg"))
    rows = [  # sizes given: GETs alone (HEADs against servers as they are: test_nginx.py)
        {"key": k, "label": i, "size": (jpeg_folder / k).stat().st_size}
        for i, k in enumerate(files)
    ]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    want, want_labels, _ = _pixels(str(jpeg_folder), manifest)
    with PythonHTTPServer(jpeg_folder) as server:
        got, labels, stats = _pixels(server.endpoint + "/", manifest, tmp_path / "cache")
        requests = server.requests()
    assert np.array_equal(labels, want_labels) and np.array_equal(got, want)
    assert stats.retries == {} and stats.skipped == {}
    gets = Counter(path for method, path, status in requests if method == "GET" and status == 200)
    assert gets == Counter({"/" + k: 1 for k in files})
    assert all(status == 200 for _, _, status in requests)
