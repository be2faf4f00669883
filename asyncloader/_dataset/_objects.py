"""Compact object lists: a million keys as a few arrays, not a million Python objects.

A listed object as an :class:`ObjectInfo` (with its key and ETag strings) costs about 260
bytes, and a :class:`Sample` around it 60 more: ~300 MB for ImageNet's 1.28 M keys, in every
process that holds the list — and a DataLoader worker that merely reads a forked copy
writes every object's reference count, so the pages are copied anyway.  Here the same list
is: the keys in one UTF-8 blob with an offset array, the sizes in an int64 array, the ETags
as 16 bytes each when they are all MD5 hex (else a blob with offsets), and the labels in an
int32 array: ~80 bytes a key, pickled (to DataLoader workers, across ranks) as a handful of
buffers.  Items are made on access; both classes are read-only ``Sequence`` s.
"""

from __future__ import annotations

import binascii
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from .._base._types import ObjectInfo, Sample

__all__ = ["ObjectList", "ObjectListBuilder", "SampleList", "texts_from_arrays", "texts_to_arrays"]

_I64 = npt.NDArray[np.int64]


def _pack(items: Sequence[bytes]) -> tuple[bytes, _I64]:
    """``items`` as one blob and ``len(items) + 1`` offsets (item ``i`` is
    ``blob[offsets[i]:offsets[i + 1]]``)."""
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, items), np.int64, len(items)), out=offsets[1:])
    return b"".join(items), offsets


class _Strings:
    """Strings in one UTF-8 blob with offsets; or, when every one is 32 hex digits (an MD5
    ETag), 16 bytes each."""

    __slots__ = ("_blob", "_hex", "_offsets")

    def __init__(self, items: Sequence[bytes], *, hex_ok: bool = False) -> None:
        if hex_ok and items and all(len(s) == 32 for s in items):
            joined = b"".join(items)
            try:
                self._blob = binascii.unhexlify(joined)
                if binascii.hexlify(self._blob) == joined:  # lower case: exact
                    self._hex, self._offsets = True, np.zeros(0, np.int64)
                    return
            except binascii.Error:
                pass
        self._hex = False
        self._blob, self._offsets = _pack(items)

    def __len__(self) -> int:
        return len(self._blob) // 16 if self._hex else len(self._offsets) - 1

    def raw(self, i: int) -> bytes:
        if self._hex:
            return binascii.hexlify(self._blob[16 * i : 16 * i + 16])
        return self._blob[self._offsets[i] : self._offsets[i + 1]]

    def get(self, i: int) -> str:
        return self.raw(i).decode()

    def take(self, order: _I64) -> _Strings:
        out = _Strings.__new__(_Strings)
        if self._hex:
            rows = np.frombuffer(self._blob, np.uint8).reshape(-1, 16)
            out._blob, out._hex, out._offsets = rows[order].tobytes(), True, self._offsets
        else:
            out._hex = False
            out._blob, out._offsets = _pack([self.raw(int(i)) for i in order])
        return out

    def all(self) -> list[str]:
        """Every string, decoded (one pass over the blob)."""
        if self._hex:
            text = binascii.hexlify(self._blob).decode()
            return [text[i : i + 32] for i in range(0, len(text), 32)]
        blob = self._blob
        o = self._offsets.tolist()
        return [blob[o[i] : o[i + 1]].decode() for i in range(len(o) - 1)]

    def nbytes(self) -> int:
        return len(self._blob) + self._offsets.nbytes

    def feed(self, h: Any) -> None:
        """Add the strings to the hash ``h`` in one form whatever the representation (the
        same strings kept as hex pairs or as a blob hash alike)."""
        if self._hex:
            n = len(self._blob) // 16
            h.update(np.arange(0, 32 * n + 1, 32, dtype="<i8").tobytes())
            h.update(binascii.hexlify(self._blob))
        else:
            h.update(self._offsets.astype("<i8", copy=False).tobytes())
            h.update(self._blob)

    @classmethod
    def concat(cls, parts: Sequence[_Strings]) -> _Strings:
        out = cls.__new__(cls)
        if parts and all(p._hex for p in parts):
            out._blob, out._hex, out._offsets = (
                b"".join(p._blob for p in parts),
                True,
                parts[0]._offsets,
            )
            return out
        plain = [p if not p._hex else _Strings([p.raw(i) for i in range(len(p))]) for p in parts]
        out._hex = False
        out._blob = b"".join(p._blob for p in plain)
        offsets = [np.zeros(1, np.int64)]
        base = 0
        for p in plain:
            offsets.append(p._offsets[1:] + base)
            base += len(p._blob)
        out._offsets = np.concatenate(offsets)
        return out

    def arrays(self, name: str) -> dict[str, npt.NDArray[Any]]:
        return {
            f"{name}_blob": np.frombuffer(self._blob, np.uint8),
            f"{name}_offsets": self._offsets,
            f"{name}_hex": np.array(self._hex),
        }

    @classmethod
    def from_arrays(cls, arrays: Any, name: str) -> _Strings:
        out = cls.__new__(cls)
        out._blob = arrays[f"{name}_blob"].tobytes()
        out._offsets = np.asarray(arrays[f"{name}_offsets"], dtype=np.int64)
        out._hex = bool(arrays[f"{name}_hex"])
        expected = len(out._blob) // 16 if out._hex else len(out._offsets) - 1
        if (out._hex and len(out._blob) % 16) or expected < 0:
            raise ValueError(f"damaged {name} arrays")
        if not out._hex and (out._offsets[0] != 0 or out._offsets[-1] != len(out._blob)):
            raise ValueError(f"damaged {name} arrays")
        return out


def texts_to_arrays(name: str, texts: Sequence[str]) -> dict[str, npt.NDArray[Any]]:
    """``texts`` as named arrays (a blob and offsets), for ``numpy.savez``."""
    return _Strings([t.encode() for t in texts]).arrays(name)


def texts_from_arrays(arrays: Any, name: str) -> list[str]:
    """The texts :func:`texts_to_arrays` stored under ``name``.

    Raises:
        ValueError: damaged arrays; KeyError: missing ones.
    """
    return _Strings.from_arrays(arrays, name).all()


class _Items:
    """Equal to any sequence of the same items, as a list is (and so, like a list,
    unhashable)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        text = isinstance(other, str | bytes)
        if isinstance(self, Sequence) and isinstance(other, Sequence) and not text:
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class ObjectList(_Items, Sequence[ObjectInfo]):
    """Listed objects as arrays (see the module's docstring); a read-only sequence of
    :class:`ObjectInfo`, made on access."""

    __slots__ = ("_etags", "_keys", "_sizes")

    def __init__(self, keys: Sequence[bytes], sizes: Sequence[int] | _I64, etags: Sequence[bytes]):
        """From parallel sequences: UTF-8 keys, sizes [bytes], ETags (ASCII, unquoted)."""
        if not len(keys) == len(sizes) == len(etags):
            raise ValueError("keys, sizes and etags differ in length")
        self._keys = _Strings(keys)
        self._sizes = np.asarray(sizes, dtype=np.int64)
        self._etags = _Strings(etags, hex_ok=True)

    @classmethod
    def of(cls, objects: Iterable[ObjectInfo]) -> ObjectList:
        """The list of ``objects`` (returned as it is if it is one already)."""
        if isinstance(objects, ObjectList):
            return objects
        items = list(objects)
        return cls(
            [o.key.encode() for o in items],
            np.fromiter((o.size for o in items), np.int64, len(items)),
            [o.etag.encode() for o in items],
        )

    def __len__(self) -> int:
        return len(self._sizes)

    @overload
    def __getitem__(self, i: int) -> ObjectInfo: ...
    @overload
    def __getitem__(self, i: slice) -> ObjectList: ...
    def __getitem__(self, i: int | slice) -> ObjectInfo | ObjectList:
        if isinstance(i, slice):
            return self.take(np.arange(len(self), dtype=np.int64)[i])
        n = len(self._sizes)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("object index out of range")
        return ObjectInfo(self._keys.get(i), int(self._sizes[i]), self._etags.get(i))

    def __iter__(self) -> Iterator[ObjectInfo]:
        for key, size, etag in zip(*self.columns(), strict=True):
            yield ObjectInfo(key, size, etag)

    def __repr__(self) -> str:
        return f"ObjectList({len(self)} objects, {self.nbytes() / 1e6:.1f} MB)"

    def keys(self) -> list[str]:
        """Every key (one pass, for building a dataset)."""
        return self._keys.all()

    def sizes(self) -> _I64:
        """Every size [bytes; -1: unknown], as an array (read-only)."""
        view = self._sizes.view()
        view.flags.writeable = False
        return view

    def take(self, order: Sequence[int] | _I64) -> ObjectList:
        """The objects at ``order``, in that order."""
        idx = np.asarray(order, dtype=np.int64)
        out = ObjectList.__new__(ObjectList)
        out._keys, out._etags = self._keys.take(idx), self._etags.take(idx)
        out._sizes = self._sizes[idx]
        return out

    def nbytes(self) -> int:
        """Memory held by the arrays [bytes]."""
        return self._keys.nbytes() + self._sizes.nbytes + self._etags.nbytes()

    def digest(self) -> str:
        """A hex digest of the list: its count, keys, sizes and ETags, in order.  Two lists
        have the same digest exactly when they hold the same objects, however they were
        made (listed in chunks, read from a manifest or a saved listing)."""
        h = hashlib.sha256(b"asyncloader objects 1\0")
        h.update(np.int64(len(self)).astype("<i8").tobytes())
        self._keys.feed(h)
        h.update(self._sizes.astype("<i8", copy=False).tobytes())
        self._etags.feed(h)
        return h.hexdigest()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (self._keys, self._sizes, self._etags))

    def arrays(self) -> dict[str, npt.NDArray[Any]]:
        """The list as named arrays (``numpy.savez``; read back with :meth:`from_arrays`)."""
        return {**self._keys.arrays("keys"), "sizes": self._sizes, **self._etags.arrays("etags")}

    @classmethod
    def from_arrays(cls, arrays: Any) -> ObjectList:
        """The list :meth:`arrays` gave (a mapping of arrays, as ``numpy.load`` returns).

        Raises:
            ValueError: arrays that do not make a list (a damaged file); KeyError: missing.
        """
        keys = _Strings.from_arrays(arrays, "keys")
        etags = _Strings.from_arrays(arrays, "etags")
        sizes = np.asarray(arrays["sizes"], dtype=np.int64)
        if not len(keys) == len(etags) == len(sizes):
            raise ValueError("damaged object list arrays")
        return _restore(keys, sizes, etags)

    @classmethod
    def concat(cls, parts: Sequence[ObjectList]) -> ObjectList:
        """One list of ``parts``, in order."""
        keys = _Strings.concat([p._keys for p in parts])
        etags = _Strings.concat([p._etags for p in parts])
        sizes = np.concatenate([p._sizes for p in parts]) if parts else np.zeros(0, np.int64)
        return _restore(keys, sizes, etags)

    def columns(self) -> tuple[list[str], list[int], list[str]]:
        """Keys, sizes and ETags as three lists (one pass each)."""
        return self.keys(), self._sizes.tolist(), self._etags.all()

    def replaced(self, known: Iterable[tuple[int, ObjectInfo]]) -> ObjectList:
        """This list with the size and ETag of some places replaced by those of
        ``(place, object)`` (the object listed there, asked again)."""
        sizes = self._sizes.copy()
        etags = self._etags.all()
        for i, obj in known:
            sizes[i] = obj.size
            etags[i] = obj.etag
        return _restore(self._keys, sizes, _Strings([e.encode() for e in etags], hex_ok=True))


def _restore(keys: _Strings, sizes: _I64, etags: _Strings) -> ObjectList:
    out = ObjectList.__new__(ObjectList)
    out._keys, out._sizes, out._etags = keys, sizes, etags
    return out


class ObjectListBuilder:
    """An :class:`ObjectList` made while objects arrive, compacted ``chunk`` at a time, so
    that a listing never holds more than one chunk of them as Python objects."""

    def __init__(self, chunk: int = 4096) -> None:
        self._chunk = chunk
        self._parts: list[ObjectList] = []
        self._pending: list[ObjectInfo] = []

    def add(self, obj: ObjectInfo) -> None:
        self._pending.append(obj)
        if len(self._pending) >= self._chunk:
            self._parts.append(ObjectList.of(self._pending))
            self._pending = []

    def build(self) -> ObjectList:
        if self._pending or not self._parts:
            self._parts.append(ObjectList.of(self._pending))
            self._pending = []
        return self._parts[0] if len(self._parts) == 1 else ObjectList.concat(self._parts)


class SampleList(_Items, Sequence[Sample]):
    """A dataset's samples: an :class:`ObjectList` and an int32 label per object; a
    read-only sequence of :class:`Sample`, made on access."""

    __slots__ = ("labels", "objects")

    def __init__(self, objects: ObjectList, labels: Sequence[int] | npt.NDArray[Any]) -> None:
        if len(objects) != len(labels):
            raise ValueError("objects and labels differ in length")
        self.objects = objects
        self.labels = np.asarray(labels, dtype=np.int32)

    def __len__(self) -> int:
        return len(self.objects)

    @overload
    def __getitem__(self, i: int) -> Sample: ...
    @overload
    def __getitem__(self, i: slice) -> SampleList: ...
    def __getitem__(self, i: int | slice) -> Sample | SampleList:
        if isinstance(i, slice):
            idx = np.arange(len(self), dtype=np.int64)[i]
            return SampleList(self.objects.take(idx), self.labels[idx])
        return Sample(self.objects[i], int(self.labels[i]))

    def __iter__(self) -> Iterator[Sample]:
        for obj, label in zip(self.objects, self.labels.tolist(), strict=True):
            yield Sample(obj, label)

    def __repr__(self) -> str:
        return f"SampleList({len(self)} samples)"
