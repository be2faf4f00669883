"""The optional C extensions: region-of-interest JPEG decoding over libjpeg-turbo,
Pillow's BILINEAR resize straight into a sample, and the cache's CRC-32.

Everything else is in pyproject.toml.  ``_jpegroi`` builds where libjpeg-turbo's headers are
(Debian/Ubuntu: ``libjpeg62-turbo-dev`` / ``libjpeg-turbo8-dev``; ``.ci/run`` installs them
when it can); where they are not, the package installs without it and Pillow decodes every
JPEG whole (``asyncloader._decode.ROI_DECODE`` says which).  ``_resize`` needs only a C
compiler; without it Pillow resizes (``asyncloader._decode.FAST_RESIZE``).  ``_crc``
(zlib's CRC-32, by carry-less multiplication) needs only a C compiler; without it the
cache uses ``zlib.crc32``.
"""

from __future__ import annotations

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Build the extension if this machine can; never fail the install over it."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # a missing header or library, no compiler
            self.warn(f"{ext.name} not built ({exc}); the Python path will do its work")


setup(
    ext_modules=[
        Extension(
            "asyncloader._decode._jpegroi",
            ["asyncloader/_decode/_jpegroi.c"],
            libraries=["jpeg"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "asyncloader._decode._resize",
            ["asyncloader/_decode/_resize.c"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "asyncloader._cache._crc",
            ["asyncloader/_cache/_crc.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
