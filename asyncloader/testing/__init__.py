"""Test equipment users can run against their own code.

* Servers on 127.0.0.1 (``_servers``): :class:`S3TestServer` (our light S3 server with
  injected latency and faults), :class:`MotoServer`; :class:`Azurite` (``_azurite``).
* :class:`Nginx` (``_nginx``): nginx serving a folder in the configuration a test asks
  for (ranges ignored, gzip, rate limits, ...), its answers read back from its access log.
* :class:`Apache` (``_apache``): Apache httpd serving (a copy of) a folder with
  ``mod_autoindex`` pages as Debian configures them, its answers read back.
* :class:`Caddy` (``_caddy``): Caddy's ``file_server browse`` serving a folder (its folder
  pages in HTML, or JSON with exact sizes for a request that accepts it), its answers read
  back from its access log.
* :class:`Express` (``_express``): Node's Express serving a folder with ``express.static``
  and ``serve-index`` (folder links without their slash), its answers read back.
* :class:`Lighttpd` (``_lighttpd``): lighttpd serving a folder with its folder pages (a
  table of links, rounded sizes: Apache's kind), its answers read back from its access log.
* :class:`PythonHTTPServer` (``_pyhttp``): ``python -m http.server`` serving a folder
  (HTTP/1.0, a connection per request), its requests read back from its log.
* :class:`FaultProxy` (``_faultproxy``): a TCP proxy that injects resets, truncation and
  stalls in front of any of them, and refuses tokens it is told are revoked.
* :class:`LimitProxy` (``_limitproxy``): a ``CONNECT`` proxy of our own that refuses a
  client's connections past a number with 403, as squid's ``maxconn`` rule does.
* :class:`TinyProxy` (``_tinyproxy``): tinyproxy, a forward proxy: plain-HTTP requests
  forwarded, HTTPS through ``CONNECT`` tunnels, Basic credentials and allowed ports as a
  test asks, its requests read back from its log.
* :class:`TokenServer` (``_tokens``): a local OAuth token service (a Google service
  account's token endpoint, an Azure managed identity endpoint).
* :class:`MemoryStore` and :class:`FaultyStore` (``_memory``): an in-memory store, and a
  wrapper injecting latency, errors, truncation and stalls at the protocol level, for
  pipeline tests that need no server.
* :func:`check_object_store` (``_conformance``): the conformance suite every
  :class:`~asyncloader.ObjectStore` passes.
* :func:`bucket_reference` (``_reference``): a bucketed sample's pixels by Pillow alone, as
  docs/data.md defines them.
* :func:`make_jpeg_folder`, :func:`demo_bucket`: the demo's ImageNet-like JPEGs (made from
  real photos) and the emulator bucket that serves them (they live in the package proper).

Also here: what the web servers share (``_webserver``: their start, work folder, logs and
answers), fake-gcs-server (``_gcs``), the demo's bucket (``_demo``), the start/stop shape
of the servers (``_equipment``), and the light S3 server's protocol, answers and state
(``_s3server``, ``_s3answers``, ``_s3state``).
"""

from ._apache import Apache as Apache
from ._apache import find_apache as find_apache
from ._azurite import Azurite as Azurite
from ._azurite import find_azurite as find_azurite
from ._caddy import Caddy as Caddy
from ._caddy import find_caddy as find_caddy
from ._conformance import StoreFixture as StoreFixture
from ._conformance import check_object_store as check_object_store
from ._demo import DemoBucket as DemoBucket
from ._demo import demo_bucket as demo_bucket
from ._demo import make_jpeg_folder as make_jpeg_folder
from ._equipment import descendants as descendants
from ._equipment import process_cpu_seconds as process_cpu_seconds
from ._equipment import tree_cpu_seconds as tree_cpu_seconds
from ._express import Express as Express
from ._express import find_express as find_express
from ._faultproxy import FaultProxy as FaultProxy
from ._gcs import GCSEmulator as GCSEmulator
from ._gcs import find_fake_gcs_server as find_fake_gcs_server
from ._lighttpd import Lighttpd as Lighttpd
from ._lighttpd import find_lighttpd as find_lighttpd
from ._limitproxy import LimitProxy as LimitProxy
from ._memory import MEMORY_FAULTS as MEMORY_FAULTS
from ._memory import FaultyStore as FaultyStore
from ._memory import MemoryBucket as MemoryBucket
from ._memory import MemoryStore as MemoryStore
from ._nginx import Nginx as Nginx
from ._nginx import find_nginx as find_nginx
from ._pyhttp import PythonHTTPServer as PythonHTTPServer
from ._reference import bucket_reference as bucket_reference
from ._s3state import FAULT_KINDS as FAULT_KINDS
from ._servers import TEST_ENV as TEST_ENV
from ._servers import MotoServer as MotoServer
from ._servers import S3TestServer as S3TestServer
from ._servers import free_port as free_port
from ._tinyproxy import TinyProxy as TinyProxy
from ._tinyproxy import find_tinyproxy as find_tinyproxy
from ._tokens import TOKEN_MARK as TOKEN_MARK
from ._tokens import TokenServer as TokenServer

__all__ = [
    "FAULT_KINDS",
    "MEMORY_FAULTS",
    "TEST_ENV",
    "TOKEN_MARK",
    "Apache",
    "Azurite",
    "Caddy",
    "DemoBucket",
    "Express",
    "FaultProxy",
    "FaultyStore",
    "GCSEmulator",
    "LimitProxy",
    "Lighttpd",
    "MemoryBucket",
    "MemoryStore",
    "MotoServer",
    "Nginx",
    "PythonHTTPServer",
    "S3TestServer",
    "StoreFixture",
    "TinyProxy",
    "TokenServer",
    "bucket_reference",
    "check_object_store",
    "demo_bucket",
    "descendants",
    "process_cpu_seconds",
    "tree_cpu_seconds",
    "find_apache",
    "find_azurite",
    "find_caddy",
    "find_express",
    "find_fake_gcs_server",
    "find_lighttpd",
    "find_nginx",
    "find_tinyproxy",
    "free_port",
    "make_jpeg_folder",
]
