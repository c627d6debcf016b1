"""``torch.save`` checkpoints read and written without torch, and without running their code.

The layout (torch ≥ 1.6's zip serialisation) is a zip archive whose entries sit under one
folder (``archive/`` or the file's stem)::

  <folder>/data.pkl      the payload, pickled; each tensor is a call to
                         torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
                         requires_grad, backward_hooks[, metadata]) whose storage is a
                         persistent id ('storage', torch.<Type>Storage, key, location, numel)
  <folder>/data/<key>    that storage's raw bytes, numel items of the storage type
  <folder>/byteorder     "little" or "big" (absent in old files: little)
  <folder>/version       the archive format version (torch's reader requires it)

:func:`read_checkpoint` unpickles ``data.pkl`` with an :class:`pickle.Unpickler` whose
``find_class`` resolves only the globals such a payload needs (:data:`ALLOWED`: the tensor
rebuild functions, the storage types, ``collections.OrderedDict``), each mapped to a NumPy
stand-in; any other global — ``os.system``, ``builtins.eval``, a class of any module — is a
:class:`UserError` before it is looked up, so nothing named by the file is ever imported or
called. Tensors come back as NumPy arrays (copies; bfloat16 widened to float32).

:func:`write_checkpoint` emits the same opcodes by hand (pickle protocol 2, as torch.save
uses) for a payload of dicts, lists, tuples, strings, numbers and NumPy arrays, so that
``torch.load(..., weights_only=True)`` reads it: the standard Pickler cannot name
``torch._utils._rebuild_tensor_v2`` without importing torch.
"""
from __future__ import annotations

import collections
import io
import math
import os
import pathlib
import pickle
import struct
import zipfile
import zlib
from typing import Any

import numpy as np

from hyset_jax.errors import UserError

# torch storage type name -> (NumPy item type without byte order, bytes per item).
# BFloat16 has no NumPy type: its storage is read as uint16 and widened (see _widen_bf16).
STORAGE_DTYPES = {
    "FloatStorage": "f4", "DoubleStorage": "f8", "HalfStorage": "f2", "BFloat16Storage": "u2",
    "LongStorage": "i8", "IntStorage": "i4", "ShortStorage": "i2", "CharStorage": "i1",
    "ByteStorage": "u1", "BoolStorage": "b1",
}
# NumPy dtype -> the storage type torch.save names for it (what write_checkpoint emits).
_WRITE_STORAGE = {np.dtype(np.float32): "FloatStorage", np.dtype(np.float64): "DoubleStorage",
                  np.dtype(np.float16): "HalfStorage", np.dtype(np.int64): "LongStorage",
                  np.dtype(np.int32): "IntStorage", np.dtype(np.int16): "ShortStorage",
                  np.dtype(np.int8): "CharStorage", np.dtype(np.uint8): "ByteStorage",
                  np.dtype(np.bool_): "BoolStorage"}
ARCHIVE_VERSION = b"3\n"  # what torch 2.x writes; its reader accepts 1..the current version
ALIGNMENT = 64            # torch aligns each record's data to 64 bytes (for mmap loading)


class _StorageType:
  """Stand-in for ``torch.<Name>Storage``: only carries the item type. Immutable (no
  ``__dict__``, no setattr), so a pickle BUILD opcode cannot retarget it."""
  __slots__ = ("name", "code")

  def __init__(self, name: str):
    object.__setattr__(self, "name", name)
    object.__setattr__(self, "code", STORAGE_DTYPES[name])

  def __setattr__(self, key, value):
    raise AttributeError("storage types are read-only")


class _Storage:
  """One storage's items, flat, as read from ``data/<key>``."""

  def __init__(self, array: np.ndarray, bf16: bool):
    self.array, self.bf16 = array, bf16


def _widen_bf16(a: np.ndarray) -> np.ndarray:
  """bfloat16 bits (uint16) as float32: the same sign, exponent and leading mantissa bits."""
  return (a.astype(np.uint32) << 16).view(np.float32)


class _Rebuild:
  """The tensor rebuild functions a payload may call, checking every argument they get."""

  def __init__(self, where: str):
    self.where = where

  def tensor(self, storage, offset, size, stride, requires_grad=False, hooks=None,
             metadata=None, *rest):
    """torch._utils._rebuild_tensor_v2: a strided view of the storage, copied."""
    if rest or not isinstance(storage, _Storage):
      raise self._bad("a tensor's arguments are not (storage, offset, size, stride, ...)")
    ints = (offset, *tuple(size or ()), *tuple(stride or ()))
    if (not isinstance(size, tuple) or not isinstance(stride, tuple) or len(size) != len(stride)
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in ints)
        or offset < 0 or min(size, default=0) < 0 or min(stride, default=0) < 0):
      raise self._bad(f"a tensor has size {size!r}, stride {stride!r}, offset {offset!r}")
    flat = storage.array
    n = math.prod(size)
    last = offset + sum((d - 1) * s for d, s in zip(size, stride)) if n else offset - 1
    # More items than the storage holds means aliasing (stride 0): a state_dict has none, and
    # copying such a view could ask for any amount of memory.
    if last >= flat.size or n > flat.size:
      raise self._bad(f"a tensor of size {list(size)} at offset {offset} reaches item {last} "
                      f"of a storage of {flat.size} items")
    if n == 0:
      out = np.zeros(size, flat.dtype)
    else:
      strides = tuple(s * flat.itemsize for s in stride)
      out = np.lib.stride_tricks.as_strided(flat[offset:], size, strides, writeable=False).copy()
    return _widen_bf16(out) if storage.bf16 else out

  def parameter(self, data, requires_grad=False, hooks=None, *rest):
    """torch._utils._rebuild_parameter: a Parameter is its tensor here."""
    if rest or not isinstance(data, np.ndarray):
      raise self._bad("a parameter does not wrap a tensor")
    return data

  def _bad(self, what: str) -> UserError:
    return UserError(f"{self.where}: {what}; not a tensor checkpoint torch.save wrote")


def _allowed(rebuild: _Rebuild) -> dict[tuple[str, str], Any]:
  """The only globals data.pkl may name, and what each becomes. The callables are fresh
  closures per load: a BUILD opcode aimed at one can only touch that load's own object."""

  def tensor(*args):
    return rebuild.tensor(*args)

  def parameter(*args):
    return rebuild.parameter(*args)

  table: dict[tuple[str, str], Any] = {
      ("torch._utils", "_rebuild_tensor_v2"): tensor,
      ("torch._utils", "_rebuild_parameter"): parameter,
      ("collections", "OrderedDict"): collections.OrderedDict,
  }
  table.update({("torch", name): _StorageType(name) for name in STORAGE_DTYPES})
  return table


ALLOWED = tuple(sorted(_allowed(_Rebuild("")).keys()))  # (module, name) pairs, for the docs


class _RestrictedUnpickler(pickle.Unpickler):
  """Resolves only :data:`ALLOWED` globals; storages come from the archive by key."""

  def __init__(self, data: bytes, archive: zipfile.ZipFile, folder: str, order: str,
               where: str):
    super().__init__(io.BytesIO(data))
    self._archive, self._folder, self._order, self._where = archive, folder, order, where
    self._table = _allowed(_Rebuild(where))
    self._storages: dict[str, _Storage] = {}

  def find_class(self, module: str, name: str) -> Any:
    found = self._table.get((module, name))
    if found is None:
      raise UserError(f"{self._where}: data.pkl names the global {module}.{name}; a checkpoint "
                      f"may hold only tensors and plain containers, so it is refused (nothing "
                      f"from the file was run)")
    return found

  def persistent_load(self, pid: Any) -> _Storage:
    ok = (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
          and isinstance(pid[1], _StorageType) and isinstance(pid[2], str)
          and isinstance(pid[4], int) and not isinstance(pid[4], bool) and pid[4] >= 0)
    if not ok:
      raise UserError(f"{self._where}: data.pkl has the persistent id {pid!r}; expected "
                      f"('storage', torch.<Type>Storage, key, location, numel)")
    _, kind, key, _, numel = pid
    if key in self._storages:
      return self._storages[key]
    entry = f"{self._folder}data/{key}"
    try:
      raw = self._archive.read(entry)
    except KeyError:
      raise UserError(f"{self._where}: storage {key!r} named in data.pkl has no entry "
                      f"{entry} in the archive") from None
    dtype = np.dtype(kind.code).newbyteorder("<" if self._order == "little" else ">")
    if len(raw) < numel * dtype.itemsize:
      raise UserError(f"{self._where}: storage {key!r} ({kind.name}) should hold {numel} "
                      f"items, {numel * dtype.itemsize} bytes; the archive has {len(raw)}")
    array = np.frombuffer(raw, dtype, count=numel).astype(dtype.newbyteorder("="))
    storage = _Storage(array, bf16=kind.name == "BFloat16Storage")
    self._storages[key] = storage
    return storage


# What reading a damaged entry raises: zipfile's own errors, and the decompressors' and its
# refusals (a method or encryption it lacks) when the flags of a stored entry are flipped.
_ZIP_ERRORS: tuple[type[BaseException], ...] = (zipfile.BadZipFile, EOFError, OSError,
                                                NotImplementedError, RuntimeError, zlib.error)
try:
  import lzma
  _ZIP_ERRORS += (lzma.LZMAError,)
except ImportError:  # a Python built without lzma cannot be asked to decompress it either
  pass


def _record_folder(names: list[str], where: str) -> str:
  """The folder (with its slash) that holds data.pkl: torch names it after the file."""
  found = [n[:-len("data.pkl")] for n in names
           if n.endswith("/data.pkl") and n.count("/") == 1]
  if len(found) != 1:
    shown = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
    raise UserError(f"{where}: a torch.save archive has one <folder>/data.pkl; found "
                    f"{len(found)} (entries: {shown})")
  return found[0]


def read_checkpoint(path: str | os.PathLike) -> Any:
  """The payload of a ``torch.save`` file, tensors as NumPy arrays, without torch.

  Raises:
    UserError: naming ``path`` when it is missing, not a zip archive of torch.save's layout
      (e.g. the legacy pre-1.6 format), or its pickle names anything but tensors and plain
      containers.
  """
  path = pathlib.Path(path)
  where = str(path)
  if not path.is_file():
    raise UserError(f"checkpoint {path} does not exist or is not a file")
  try:
    archive = zipfile.ZipFile(path)
  # NotImplementedError: a zip version; UnicodeDecodeError: a name flagged UTF-8 that is not.
  except (zipfile.BadZipFile, NotImplementedError, UnicodeDecodeError, ValueError):
    raise UserError(f"{where}: not a zip archive; expected a torch.save checkpoint (torch ≥ "
                    f"1.6's zip format; the legacy format of _use_new_zipfile_serialization="
                    f"False is not read)") from None
  except OSError as e:
    raise UserError(f"{where}: cannot read ({e.strerror or e})") from None
  with archive:
    names = archive.namelist()
    folder = _record_folder(names, where)
    order = "little"
    if f"{folder}byteorder" in names:
      try:  # a damaged entry fails when read, not when the directory is listed
        order = archive.read(f"{folder}byteorder").decode("ascii", "replace").strip()
      except _ZIP_ERRORS as e:
        raise UserError(f"{where}: {folder}byteorder is not readable ({e})") from None
      if order not in ("little", "big"):
        raise UserError(f"{where}: {folder}byteorder is {order!r}; expected little or big")
    try:
      data = archive.read(f"{folder}data.pkl")
      return _RestrictedUnpickler(data, archive, folder, order, where).load()
    except UserError:
      raise
    # OverflowError: a FRAME or BINUNICODE length past the platform's limit.
    except (pickle.UnpicklingError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            MemoryError, OverflowError, UnicodeDecodeError, *_ZIP_ERRORS) as e:
      raise UserError(f"{where}: {folder}data.pkl is not a readable checkpoint pickle "
                      f"({type(e).__name__}: {e})") from None


# --------------------------------------------------------------------------- writing

class _Emitter:
  """Pickle protocol 2 opcodes for the payloads torch.save writes; tensors become storages."""

  def __init__(self):
    self.out = io.BytesIO()
    self.storages: list[np.ndarray] = []

  def op(self, code: bytes) -> None:
    self.out.write(code)

  def global_(self, module: str, name: str) -> None:
    self.op(b"c" + module.encode() + b"\n" + name.encode() + b"\n")

  def value(self, v: Any) -> None:
    if v is None:
      self.op(b"N")
    elif isinstance(v, bool):
      self.op(b"\x88" if v else b"\x89")
    elif isinstance(v, (int, np.integer)):
      self.integer(int(v))
    elif isinstance(v, (float, np.floating)):
      self.op(b"G" + struct.pack(">d", float(v)))
    elif isinstance(v, str):
      raw = v.encode("utf-8")
      self.op(b"X" + struct.pack("<I", len(raw)) + raw)
    elif isinstance(v, np.ndarray):
      self.tensor(v)
    elif isinstance(v, collections.OrderedDict):
      self.global_("collections", "OrderedDict")
      self.op(b")R")
      self.items(v)
    elif isinstance(v, dict):
      self.op(b"}")
      self.items(v)
    elif isinstance(v, list):
      self.op(b"]")
      if v:
        self.op(b"(")
        for item in v:
          self.value(item)
        self.op(b"e")
    elif isinstance(v, tuple):
      self.tuple(v)
    else:
      raise TypeError(f"cannot write a {type(v).__name__} into a checkpoint payload")

  def integer(self, v: int) -> None:
    if 0 <= v < 256:
      self.op(b"K" + bytes([v]))
    elif 0 <= v < 65536:
      self.op(b"M" + struct.pack("<H", v))
    elif -2 ** 31 <= v < 2 ** 31:
      self.op(b"J" + struct.pack("<i", v))
    else:
      raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
      self.op(b"\x8a" + bytes([len(raw)]) + raw)

  def tuple(self, v: tuple) -> None:
    if not v:
      self.op(b")")
      return
    if len(v) > 3:
      self.op(b"(")
    for item in v:
      self.value(item)
    self.op(b"t" if len(v) > 3 else {1: b"\x85", 2: b"\x86", 3: b"\x87"}[len(v)])

  def items(self, d: dict) -> None:
    if not d:
      return
    self.op(b"(")
    for k, item in d.items():
      self.value(k)
      self.value(item)
    self.op(b"u")

  def tensor(self, a: np.ndarray) -> None:
    """_rebuild_tensor_v2(storage, 0, shape, contiguous strides, False, OrderedDict())."""
    kind = _WRITE_STORAGE.get(a.dtype)
    if kind is None:
      raise TypeError(f"cannot write a {a.dtype} array as a torch tensor")
    # np.asarray(order="C"), not ascontiguousarray: that makes a 0-d array 1-d.
    a = np.asarray(a, a.dtype.newbyteorder("<"), order="C")
    key = str(len(self.storages))
    self.storages.append(a)
    strides, acc = [], 1
    for d in reversed(a.shape):
      strides.append(acc)
      acc *= d
    self.global_("torch._utils", "_rebuild_tensor_v2")
    self.op(b"(")
    self.op(b"(")                                      # the persistent id, a 5-tuple
    self.value("storage")
    self.global_("torch", kind)
    self.value(key)
    self.value("cpu")
    self.integer(int(a.size))
    self.op(b"tQ")
    self.integer(0)
    self.tuple(tuple(int(d) for d in a.shape))
    self.tuple(tuple(reversed(strides)))
    self.op(b"\x89")                                   # requires_grad = False
    self.global_("collections", "OrderedDict")
    self.op(b")R")                                     # backward hooks: OrderedDict()
    self.op(b"tR")

  def payload(self, v: Any) -> bytes:
    self.op(b"\x80\x02")
    self.value(v)
    self.op(b".")
    return self.out.getvalue()


def _write_record(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
  """One stored (uncompressed) entry whose data starts on an ALIGNMENT boundary, as torch
  writes them: the local header's extra field pads it (header id "FB", as torch's)."""
  offset = archive.fp.tell() + 30 + len(name.encode())
  pad = (-(offset + 4)) % ALIGNMENT
  info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
  info.compress_type = zipfile.ZIP_STORED
  info.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
  archive.writestr(info, data)


def checkpoint_bytes(payload: Any, folder: str = "archive") -> bytes:
  """``payload`` as the bytes of a torch.save file (pickle protocol 2, zip layout)."""
  emitter = _Emitter()
  pickled = emitter.payload(payload)
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
    _write_record(archive, f"{folder}/data.pkl", pickled)
    # The records torch 2.x writes beside them (its reader needs only version).
    _write_record(archive, f"{folder}/.format_version", b"1")
    _write_record(archive, f"{folder}/.storage_alignment", str(ALIGNMENT).encode())
    _write_record(archive, f"{folder}/byteorder", b"little")
    for key, a in enumerate(emitter.storages):
      _write_record(archive, f"{folder}/data/{key}", a.tobytes())
    _write_record(archive, f"{folder}/version", ARCHIVE_VERSION)
  return buf.getvalue()
