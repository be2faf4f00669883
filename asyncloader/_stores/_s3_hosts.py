"""Where an S3 bucket answers: the bucket and prefix of an ``s3://`` URL, AWS's regional,
FIPS and dual-stack hosts, virtual-hosted or path style, and a host moved to the bucket's
region."""

from __future__ import annotations

from urllib.parse import urlsplit

from yarl import URL

from ._s3_auth import uri_encode_path

__all__ = ["aws_host_in", "bucket_address", "parse_s3_url"]


def bucket_address(
    bucket: str,
    endpoint: URL,
    region: str,
    *,
    aws: bool,
    fips: bool,
    dualstack: bool,
    style: str = "auto",
) -> tuple[str, str, str]:
    """``(host, base URL, base path)`` of ``bucket`` behind ``endpoint``.  On AWS itself
    (``aws``: no endpoint was given, and botocore's is AWS's), the regional endpoint with
    FIPS and dual-stack as configured (``AWS_USE_FIPS_ENDPOINT``,
    ``AWS_USE_DUALSTACK_ENDPOINT``, or the profile's), virtual-hosted as AWS prefers unless
    a dotted name would not match the wildcard certificate; path style elsewhere.

    ``style`` is the AWS config's ``s3.addressing_style``: ``"virtual"`` puts the bucket in
    the host (``bucket.minio.example``) on any endpoint, ``"path"`` in the path on AWS too,
    ``"auto"`` as above.  A path on a custom endpoint (a gateway behind a reverse proxy,
    ``http://host/s3``) is kept before the bucket's, as boto3 keeps it."""
    host = endpoint.host or ""
    if style not in ("auto", "virtual", "path"):
        raise ValueError(f"s3 addressing_style must be auto, virtual or path, not {style!r}")
    if aws and host.endswith((".amazonaws.com", ".amazonaws.com.cn")):
        regional = _aws_host(region, fips=fips, dualstack=dualstack)
        if style == "virtual" or ("." not in bucket and style == "auto"):
            return f"{bucket}.{regional}", f"https://{bucket}.{regional}", ""
        return regional, f"https://{regional}", "/" + uri_encode_path(bucket)
    base_path = endpoint.raw_path.rstrip("/")  # encoded as given
    if style == "virtual":
        authority = f"{bucket}.{endpoint.raw_authority}"
        return authority, f"{endpoint.scheme}://{authority}", base_path
    authority = endpoint.raw_authority
    return authority, f"{endpoint.scheme}://{authority}", base_path + "/" + uri_encode_path(bucket)


def _aws_host(region: str, *, fips: bool, dualstack: bool) -> str:
    """S3's endpoint in ``region`` (``s3.eu-west-1.amazonaws.com``; ``s3-fips.`` and
    ``.dualstack.`` as asked; ``.amazonaws.com.cn`` in the China regions)."""
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"s3{'-fips' if fips else ''}{'.dualstack' if dualstack else ''}.{region}.{suffix}"


def aws_host_in(host: str, old: str, region: str) -> str:
    """``host``, an endpoint of AWS's in region ``old``, as the same endpoint in ``region``
    (``b.s3.us-east-1.amazonaws.com`` → ``b.s3.eu-west-1.amazonaws.com``; the global
    ``s3.amazonaws.com`` too); any other host as it is: an S3-compatible service keeps its
    address, and only the signing region moves."""
    if not host.endswith((".amazonaws.com", ".amazonaws.com.cn")):
        return host
    labels = host.split(".")
    if old in labels:
        labels[labels.index(old)] = region
    elif "s3" in labels:
        labels.insert(labels.index("s3") + 1, region)
    return ".".join(labels)


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` → ``("bucket", "some/prefix/")``."""
    parts = urlsplit(url)
    return parts.netloc, parts.path.lstrip("/")
