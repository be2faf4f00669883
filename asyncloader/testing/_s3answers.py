"""What the light S3 server (``_s3server``) answers besides objects: S3's XML (an error, a
ListObjectsV2 page) and its control endpoints (plain JSON: the fault rates and latency, a
bucket's region or requester-pays, the request counters)."""

from __future__ import annotations

import asyncio
import bisect
import json
import random
from collections.abc import Mapping
from xml.sax.saxutils import escape

from ._s3state import FAULT_KINDS, ServerState, Stored, Synthetic

__all__ = ["Answer", "control", "error_xml", "list_page"]

_DATE = "2026-01-01T00:00:00.000Z"

Answer = tuple[int, bytes, dict[str, str]]
"""An answer: its status, body and headers."""


def error_xml(code: str, message: str) -> bytes:
    """S3's error body: ``code`` and ``message``."""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>{escape(message)}</Message></Error>"
    ).encode()


def list_page(
    state: ServerState, bucket: str, objects: Mapping[str, Stored], query: dict[str, str]
) -> bytes:
    """A ListObjectsV2 page of ``bucket`` (``prefix``, ``delimiter``, ``max-keys``,
    ``continuation-token`` or ``start-after`` as ``query`` says), as S3 writes it."""
    prefix = query.get("prefix", "")
    delimiter = query.get("delimiter", "")
    max_keys = int(query.get("max-keys", "1000"))
    after = query.get("continuation-token", "") or query.get("start-after", "")
    keys = state.keys(bucket)
    contents: list[str] = []
    prefixes: list[str] = []
    last = ""
    truncated = False
    i = max(bisect.bisect_left(keys, prefix), bisect.bisect_right(keys, after))
    while i < len(keys) and keys[i].startswith(prefix):
        k = keys[i]
        i += 1
        if delimiter:
            cut = k.find(delimiter, len(prefix))
            if cut >= 0:
                cp = k[: cut + len(delimiter)]
                if len(contents) + len(prefixes) >= max_keys:
                    truncated = True
                    break
                prefixes.append(cp)
                last = cp + "\U0010ffff"
                i = bisect.bisect_left(keys, last, i)  # past the rest of the folder
                continue
        if len(contents) + len(prefixes) >= max_keys:
            truncated = True
            break
        o = objects[k]
        contents.append(
            f"<Contents><Key>{escape(k)}</Key><LastModified>{_DATE}</LastModified>"
            f"<ETag>&quot;{o.etag}&quot;</ETag><Size>{len(o.data)}</Size>"
            "<StorageClass>STANDARD</StorageClass></Contents>"
        )
        last = k
    xml = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
        f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>",
        f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>",
        f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>",
    ]
    if delimiter:
        xml.append(f"<Delimiter>{escape(delimiter)}</Delimiter>")
    if truncated:
        xml.append(f"<NextContinuationToken>{escape(last)}</NextContinuationToken>")
    xml += contents
    xml += [f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes]
    xml.append("</ListBucketResult>")
    return "".join(xml).encode()


def control(st: ServerState, method: str, path: str, body: bytes) -> Answer:
    """The answer to a control request (``/_control/...``): fault rates and latency, a
    bucket's region or requester-pays, the counters, their reset."""
    if path == "/_control/faults" and method == "POST":
        cfg = json.loads(body or b"{}")
        rates = {k: float(v) for k, v in cfg.get("rates", {}).items()}
        unknown = set(rates) - set(FAULT_KINDS)
        if unknown:
            return 400, json.dumps({"unknown": sorted(unknown)}).encode(), {}
        st.fault_rates = rates
        st.max_faults_per_key = int(cfg.get("max_faults_per_key", 3))
        st.stall_seconds = float(cfg.get("stall_seconds", st.stall_seconds))
        st.latency = float(cfg.get("latency", st.latency))
        st.rate_limit = float(cfg.get("rate_limit", st.rate_limit))
        st.burst = float(cfg.get("burst", max(st.rate_limit / 10, 1.0)))
        st._tokens, st._refilled = st.burst, asyncio.get_running_loop().time()
        st.rng = random.Random(int(cfg.get("seed", 0)))
        st.faults_by_key.clear()
        return 200, b"{}", {}
    if path == "/_control/bucket" and method == "POST":
        cfg = json.loads(body or b"{}")
        name = str(cfg["bucket"])
        if "region" in cfg:
            st.regions[name] = str(cfg["region"])
            st.region_answer = str(cfg.get("answer", "redirect"))
        if cfg.get("requester_pays"):
            st.requester_pays.add(name)
        return 200, b"{}", {}
    if path == "/_control/stats":
        out = {
            "counters": dict(st.counters),
            "gets_by_key": dict(st.gets_by_key),
            "ranges_by_key": dict(st.ranges_by_key),
            "keys": sorted(
                k
                for objs in st.buckets.values()
                if not isinstance(objs, Synthetic)  # a million names: ask for a count
                for k in objs
            ),
            "synthetic": {b: len(o) for b, o in st.buckets.items() if isinstance(o, Synthetic)},
        }
        return 200, json.dumps(out).encode(), {"Content-Type": "application/json"}
    if path == "/_control/reset-stats" and method == "POST":
        st.counters.clear()
        st.gets_by_key.clear()
        st.ranges_by_key.clear()
        return 200, b"{}", {}
    return 404, b"{}", {}
