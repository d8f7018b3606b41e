"""Reading a training partition straight from Arrow: PySpark's loader and a columnar API.

Inside the train function of ``TorchDistributor.train_on_dataframe`` every process reads
the partition its barrier task wrote once (an Arrow IPC stream under Spark's local dirs,
named by ``TORCHSPARK_PARTITION_FILE``; see torchspark/task/_partition.py). The file is
memory-mapped copy-on-write: the record batches are views of the page cache, a numeric
column becomes a tensor over those pages without a copy, and a tensor changed in place
changes only this process's private copy of the page, never the file or another rank.
Nothing here turns the partition into Python objects: only the rows of the batch being
built are touched (and strings or binary values of that batch become Python lists).

Who reads what:
- with k processes on a task (k GPUs), local rank r reads the r-th of k contiguous,
  disjoint shares of the partition's rows;
- a DataLoader worker w of W reads batches w, w+W, w+2W, ... of its process's batch
  sequence, so that the DataLoader's in-order merge yields exactly the batches one worker
  would have yielded.

Entry points: :func:`get_spark_partition_data_loader` (PySpark's, same rows and element
types, several workers allowed) and :func:`partition_batches` (dicts of tensors).
"""
from __future__ import annotations

import bisect
import json
import mmap
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import torch

# The variables a barrier task sets (torchspark/task/_partition.py); PySpark's two also lead
# here, so these readers work under PySpark's distributor as well.
from torchspark.task._partition import (PARTITION_FILE_ENV, SPARK_SCHEMA_KEY, STOCK_FILE_ENV,
                                   STOCK_SCHEMA_ENV)

__all__ = ["get_spark_partition_data_loader", "partition_batches", "partition_num_rows",
           "PARTITION_FILE_ENV"]

# PySpark's _SparkPartitionTorchDataset: the Spark types it accepts, and the tensor dtype
# its rows collate into (scalars become Python numbers, arrays keep their numpy dtype,
# vectors are float64).
_STOCK_DTYPES: Dict[str, Any] = {
    "float": np.float64, "double": np.float64,
    "int": np.int64, "bigint": np.int64, "smallint": np.int64,
    "array<float>": np.float32, "array<double>": np.float64, "array<int>": np.int32,
    "array<bigint>": np.int64, "array<smallint>": np.int16,
    "vector": np.float64,
}

Piece = Union[np.ndarray, List[Any]]


# ---- the mapped file ----------------------------------------------------------------------

class Partition:
    """An Arrow IPC file or stream, memory-mapped copy-on-write; its non-empty record
    batches are zero-copy views of the mapping."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise FileNotFoundError(
                f"torchspark: cannot open the partition file {path} ({e.strerror}): it lives "
                "as long as its barrier task, so read it inside the train function") from e
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                raise ValueError(f"torchspark: the partition file {path} is empty")
            # Private and writable: tensors over it may be changed in place (copy-on-write).
            self._mm = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
        finally:
            os.close(fd)
        self._bytes = np.frombuffer(self._mm, dtype=np.uint8)
        buf = pa.py_buffer(self._mm)
        self._lo, self._hi = buf.address, buf.address + size
        try:
            if self._mm[:6] == b"ARROW1":
                reader = pa.ipc.open_file(buf)
                batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            else:
                reader = pa.ipc.open_stream(buf)
                batches = list(reader)
        except pa.ArrowInvalid as e:
            raise ValueError(f"torchspark: {path} is not an Arrow IPC file or stream: {e}") from e
        self.schema: pa.Schema = reader.schema
        self.batches: List[pa.RecordBatch] = [b for b in batches if b.num_rows]
        self.starts: List[int] = [0]
        for b in self.batches:
            self.starts.append(self.starts[-1] + b.num_rows)
        self.num_rows = self.starts[-1]

    def values(self, arr: pa.Array, dtype: np.dtype) -> np.ndarray:
        """The values of a fixed-width array without nulls: a writable view of the mapping
        (a copy when the buffer lives elsewhere, e.g. decompressed)."""
        n = len(arr)
        buf = arr.buffers()[1]
        if buf is None or n == 0:
            return np.empty(0, dtype)
        first = arr.offset * dtype.itemsize
        if self._lo <= buf.address and buf.address + buf.size <= self._hi:
            start = buf.address - self._lo + first
            return self._bytes[start:start + n * dtype.itemsize].view(dtype)
        return np.frombuffer(buf, dtype=dtype, count=n, offset=first).copy()

    def locate(self, row: int) -> int:
        """Index of the record batch that holds row."""
        return bisect.bisect_right(self.starts, row) - 1


_opened: Dict[Tuple[Any, ...], Partition] = {}


def _open(path: str) -> Partition:
    """One mapping per process and file (a forked DataLoader worker maps it again; a new
    file at the same path is mapped anew)."""
    try:
        st = os.stat(path)
    except OSError:
        st = None
    key = (os.getpid(), path) + ((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) if st else ())
    part = _opened.get(key)
    if part is None:
        for k in [k for k in _opened if k[:2] == key[:2] or k[0] != key[0]]:
            del _opened[k]
        part = _opened[key] = Partition(path)
    return part


def _partition_path() -> Tuple[str, Optional[str]]:
    """(the partition file, PySpark's schema file or None) of this process."""
    path = os.environ.get(PARTITION_FILE_ENV)
    if path:
        return path, None
    path = os.environ.get(STOCK_FILE_ENV)
    if path:
        return path, os.environ.get(STOCK_SCHEMA_ENV)
    raise RuntimeError(
        f"torchspark: no Spark partition to read ({PARTITION_FILE_ENV} is not set): call "
        "this inside the train function given to TorchDistributor.train_on_dataframe")


def _local_share(n: int) -> Tuple[int, int]:
    """This process's rows [lo, hi) of a partition of n rows: local rank r of k reads the
    r-th of k contiguous shares."""
    k = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    r = int(os.environ.get("LOCAL_RANK", "0") or 0)
    if not 0 <= r < k:
        raise ValueError(f"torchspark: LOCAL_RANK={r} is outside LOCAL_WORLD_SIZE={k}")
    lo, hi = n * r // k, n * (r + 1) // k
    if lo == hi:
        raise ValueError(
            f"torchspark: the Spark partition has {n} rows, fewer than the {k} processes of "
            f"its task, so local rank {r} has none: repartition the DataFrame into fewer, "
            "larger partitions")
    return lo, hi


def _worker() -> Tuple[int, int]:
    info = torch.utils.data.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


# ---- Spark types ----------------------------------------------------------------------------

def _is_vector(t: pa.DataType) -> bool:
    """Spark ML's VectorUDT as Arrow carries it: struct<type: int8, size: int32,
    indices: list<int32>, values: list<double>>."""
    if not pa.types.is_struct(t) or t.num_fields != 4:
        return False
    names = [t.field(i).name for i in range(4)]
    return names == ["type", "size", "indices", "values"] and t.field(0).type == pa.int8()


_ARROW_TO_SPARK = {pa.float32(): "float", pa.float64(): "double", pa.int8(): "tinyint",
                   pa.int16(): "smallint", pa.int32(): "int", pa.int64(): "bigint",
                   pa.bool_(): "boolean", pa.string(): "string", pa.large_string(): "string",
                   pa.binary(): "binary", pa.large_binary(): "binary"}


def _spark_name(t: pa.DataType) -> str:
    """Spark's simpleString of an Arrow type Spark would have written."""
    if _is_vector(t):
        return "vector"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return f"array<{_spark_name(t.value_type)}>"
    return _ARROW_TO_SPARK.get(t, str(t))


def _spark_types(part: Partition, schema_file: Optional[str]) -> List[str]:
    """Spark type names of the partition's columns: from the Spark schema the task stored
    (metadata, or PySpark's schema file), else from the Arrow types."""
    text = None
    meta = part.schema.metadata or {}
    if SPARK_SCHEMA_KEY in meta:
        text = meta[SPARK_SCHEMA_KEY].decode("utf-8")
    elif schema_file:
        with open(schema_file, "r", encoding="utf-8") as f:
            text = f.read()
    inferred = [_spark_name(f.type) for f in part.schema]
    if text is not None:
        from pyspark.sql.types import StructType

        names = [f.dataType.simpleString() for f in StructType.fromJson(json.loads(text))]
        if len(names) == len(inferred):  # else not this file's schema: the Arrow types rule
            return names
    return inferred


# ---- columns --------------------------------------------------------------------------------

class _Part:
    """One record batch's part of a column: slice(a, b) and take(rows) give an ndarray
    (or a list, for strings and binary)."""

    def __init__(self, view: Optional[np.ndarray] = None, arr: Optional[pa.Array] = None,
                 conv: Optional[Callable[[pa.Array], Piece]] = None) -> None:
        self.view, self.arr, self.conv = view, arr, conv

    def slice(self, a: int, b: int) -> Piece:
        if self.view is not None:
            return self.view[a:b]
        return self.conv(self.arr.slice(a, b - a))  # type: ignore[misc, union-attr]

    def take(self, rows: np.ndarray) -> Piece:
        if self.view is not None:
            return self.view[rows]
        return self.conv(self.arr.take(pa.array(rows)))  # type: ignore[misc, union-attr]


class _Column:
    """A column over the record batches of a share: its parts, dtype and row shape."""

    def __init__(self, name: str, parts: List[_Part], dtype: Optional[np.dtype],
                 shape: Tuple[int, ...]) -> None:
        self.name, self.parts, self.dtype, self.shape = name, parts, dtype, shape

    @property
    def is_list(self) -> bool:
        return self.dtype is None


def _unsupported(name: str, t: pa.DataType, why: str = "") -> TypeError:
    hint = ("cast it in Spark to a number, an array of numbers or a string "
            f"(e.g. df.withColumn('{name}', F.col('{name}').cast('double'))), or leave it out "
            "with columns=[...]")
    return TypeError(f"torchspark: column '{name}' has Arrow type {t}, which cannot become a "
                     f"tensor{why}: {hint}")


def _no_nulls(name: str, arr: pa.Array) -> None:
    if arr.null_count:
        raise ValueError(
            f"torchspark: column '{name}' has {arr.null_count} null value(s); tensors have no "
            "nulls: fill or drop them in Spark first (df.na.fill(...) or df.na.drop())")


def _ragged(name: str, d: int, other: int) -> ValueError:
    return ValueError(
        f"torchspark: the rows of column '{name}' have different lengths ({d} and {other}); a "
        "column becomes one tensor, which needs one length: pad or truncate the arrays in "
        "Spark (or leave the column out with columns=[...])")


def _numeric_view(name: str, part: Partition, arr: pa.Array, widths: List[int],
                  level: int = 0) -> np.ndarray:
    """A zero-copy ndarray (rows, *widths) of a numeric array, or of lists of them whose
    rows all have one length at each level (widths: found so far, shared by the batches)."""
    t = arr.type
    _no_nulls(name, arr)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return part.values(arr, np.dtype(t.to_pandas_dtype()))
    n = len(arr)
    if pa.types.is_fixed_size_list(t):
        d = t.list_size
        child = arr.values.slice(arr.offset * d, n * d)
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        offs = part.values(arr.offsets, np.dtype(arr.offsets.type.to_pandas_dtype()))
        lens = np.diff(offs)
        if level < len(widths):
            d = widths[level]
        else:
            d = int(lens[0]) if n else 0
        bad = np.flatnonzero(lens != d)
        if bad.size:
            raise _ragged(name, d, int(lens[bad[0]]))
        child = arr.values.slice(int(offs[0]), n * d)
    else:
        raise _unsupported(name, t)
    if level == len(widths):
        widths.append(d)
    elif widths[level] != d:
        raise _ragged(name, widths[level], d)
    inner = _numeric_view(name, part, child, widths, level + 1)
    return inner.reshape((n, d) + inner.shape[1:])


def _flat(arr: pa.Array) -> Tuple[np.ndarray, np.ndarray]:
    """(offsets rebased to 0, the values they index) of a list array (copies)."""
    offs = arr.offsets.to_numpy()
    vals = arr.values.slice(int(offs[0]), int(offs[-1] - offs[0]))
    return offs - offs[0], vals.to_numpy(zero_copy_only=False)


def _vector_dims(arr: pa.StructArray) -> np.ndarray:
    """Each ML vector's size: `size` for sparse rows (type 0), the values' length for dense."""
    kind = arr.field(0).to_numpy(zero_copy_only=False)
    sizes = arr.field(1).fill_null(0).to_numpy(zero_copy_only=False)
    return np.where(kind == 0, sizes, np.diff(arr.field(3).offsets.to_numpy()))


def _densify(arr: pa.StructArray) -> np.ndarray:
    """ML vectors, dense or sparse rows, of one size -> a float64 array (rows, size)."""
    n = len(arr)
    d = int(_vector_dims(arr)[0]) if n else 0
    kind = arr.field(0).to_numpy(zero_copy_only=False)
    voffs, vals = _flat(arr.field(3))
    lens = np.diff(voffs)
    rows = np.repeat(np.arange(n), lens)
    cols = np.arange(vals.size) - np.repeat(voffs[:-1], lens)  # the position in the row
    sparse = kind[rows] == 0
    if sparse.any():
        ioffs, idx = _flat(arr.field(2))
        cols[sparse] = idx[ioffs[rows[sparse]] + cols[sparse]]
    out = np.zeros((n, d), dtype=np.float64)
    out[rows, cols] = vals
    return out


def _bools(arr: pa.Array) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=False, writable=True)


def _pylist(arr: pa.Array) -> List[Any]:
    return arr.to_pylist()


def _column(part: Partition, name: str, index: int, first: int, last: int) -> _Column:
    """Column `index` over record batches first..last: zero-copy views where the type
    allows, else per-slice converters; TypeError/ValueError for what cannot be a tensor."""
    t = part.schema.field(index).type
    parts: List[Optional[_Part]] = [None] * len(part.batches)
    widths: List[int] = []
    dtype: Optional[np.dtype] = None
    for i in range(first, last + 1):
        arr = part.batches[i].column(index)
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
                or pa.types.is_large_binary(t):
            parts[i] = _Part(arr=arr, conv=_pylist)
            continue
        _no_nulls(name, arr)
        if pa.types.is_boolean(t):
            parts[i], dtype = _Part(arr=arr, conv=_bools), np.dtype(np.bool_)
        elif _is_vector(t):
            dims = _vector_dims(arr)
            d = int(dims[0]) if not widths else widths[0]
            bad = np.flatnonzero(dims != d)
            if bad.size:
                raise _ragged(name, d, int(dims[bad[0]]))
            widths[:1] = [d]
            dtype = np.dtype(np.float64)
            kind = part.values(arr.field(0), np.dtype(np.int8))
            if (kind == 1).all():  # dense: the values are the rows
                parts[i] = _Part(view=_numeric_view(name, part, arr.field(3), [d]))
            else:
                parts[i] = _Part(arr=arr, conv=_densify)
        elif pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_list(t) \
                or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            view = _numeric_view(name, part, arr, widths)
            parts[i], dtype = _Part(view=view), view.dtype
        else:
            raise _unsupported(name, t)
    return _Column(name, parts, dtype, tuple(widths))  # type: ignore[arg-type]


def _columns(part: Partition, names: Optional[Sequence[str]], lo: int, hi: int) -> List[_Column]:
    have = part.schema.names
    if names is None:
        names = have
    elif isinstance(names, str):
        raise TypeError("torchspark: columns is a list of column names, not one string: "
                        f"columns=[{names!r}]")
    for n in names:
        if n not in have:
            raise ValueError(f"torchspark: the partition has no column '{n}'; its columns are "
                             f"{', '.join(have)}")
    if len(set(have)) != len(have):
        raise ValueError(f"torchspark: the partition's column names repeat ({', '.join(have)}): "
                         "rename them in Spark (df.toDF(...))")
    first, last = part.locate(lo), part.locate(hi - 1)
    return [_column(part, n, have.index(n), first, last) for n in names]


# ---- rows -> batches ------------------------------------------------------------------------

def _join(col: _Column, pieces: List[Piece]) -> Piece:
    if len(pieces) == 1:
        return pieces[0]
    if col.is_list:
        return [v for p in pieces for v in p]  # type: ignore[union-attr]
    return np.concatenate(pieces)  # type: ignore[arg-type]


def _ranges(s0: int, s1: int, lo: int, m: int) -> Iterator[Tuple[int, int]]:
    """Samples [s0, s1) of a share of m rows starting at row lo, wrapping around: the
    contiguous row ranges they are."""
    while s0 < s1:
        a = s0 % m
        take = min(m - a, s1 - s0)
        yield lo + a, lo + a + take
        s0 += take


def _plan(part: Partition, ranges: Sequence[Tuple[int, int]]) -> List[Tuple[int, int, int]]:
    """Row ranges -> (record batch, first, end) pieces, computed once for every column."""
    plan = []
    for a, b in ranges:
        i = part.locate(a)
        while a < b:
            start, end = part.starts[i], min(b, part.starts[i + 1])
            plan.append((i, a - start, end - start))
            a, i = end, i + 1
    return plan


def _slice_rows(col: _Column, plan: List[Tuple[int, int, int]]) -> Piece:
    return _join(col, [col.parts[i].slice(a, b) for i, a, b in plan])  # type: ignore[union-attr]


def _take_rows(part: Partition, col: _Column, rows: np.ndarray) -> Piece:
    """The given rows (any order) of a column: one gather per record batch touched."""
    order = np.argsort(rows, kind="stable")
    srt = rows[order]
    cut = np.searchsorted(srt, part.starts)
    out: Any = [None] * len(rows) if col.is_list else \
        np.empty((len(rows),) + col.shape, dtype=col.dtype)
    for i in np.flatnonzero(np.diff(cut)):
        seg = slice(cut[i], cut[i + 1])
        got = col.parts[i].take(srt[seg] - part.starts[i])  # type: ignore[union-attr]
        if col.is_list:
            for p, v in zip(order[seg], got, strict=True):
                out[p] = v
        else:
            out[order[seg]] = got
    return out


def _tensor(piece: Piece) -> Any:
    return piece if isinstance(piece, list) else torch.from_numpy(piece)


def _check_sizes(batch_size: int, num_samples: Optional[int]) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"torchspark: batch_size must be a positive integer, not {batch_size!r}")
    if num_samples is not None and (isinstance(num_samples, bool)
                                    or not isinstance(num_samples, int) or num_samples < 0):
        raise ValueError("torchspark: num_samples must be a non-negative integer, not "
                         f"{num_samples!r}")


# ---- public API -----------------------------------------------------------------------------

def partition_num_rows() -> int:
    """The number of rows this process reads from its Spark partition (its local share)."""
    part = _open(_partition_path()[0])
    lo, hi = _local_share(part.num_rows)
    return hi - lo


def partition_batches(batch_size: int, columns: Optional[Sequence[str]] = None,
                      shuffle: bool = False, seed: int = 0, drop_last: bool = False,
                      num_samples: Optional[int] = None) -> Iterator[Dict[str, Any]]:
    """One pass over this process's rows of its Spark partition, as dicts of tensors.

    Must be called inside the train function of ``TorchDistributor.train_on_dataframe``.
    Each batch maps a column name to a tensor whose first dimension is the batch's rows:
    numbers keep their Arrow dtype (float -> float32, bigint -> int64, ...), arrays of
    numbers whose rows have one length become 2-D (nested: N-D), ML vectors (dense or
    sparse) become float64 2-D, booleans torch.bool; strings and binary come as Python
    lists. Numeric columns and dense vectors are views of the mapped file (no copy) unless
    a batch spans two record batches or the rows are shuffled.

    Parameters
    ----------
    batch_size : rows per batch.
    columns : the column names to return, in this order (all by default).
    shuffle : read the rows in a random order (a permutation of this process's rows,
        drawn from ``seed``; pass e.g. the epoch number for a new order each epoch).
    drop_last : leave out the last batch when it has fewer than batch_size rows.
    num_samples : rows in the pass, wrapping around to the first row when larger than the
        share (as PySpark's loader does); the share's row count by default. Ranks of a
        DDP job must run the same number of steps: give every rank the same num_samples
        when the partitions differ in size.

    Called in a DataLoader worker, the worker yields every num_workers-th batch of the
    sequence, so the DataLoader gives the same batches in the same order.
    Raises TypeError for a column type that cannot become a tensor (naming the column)
    and ValueError for nulls and for arrays of different lengths in one column.
    """
    _check_sizes(batch_size, num_samples)
    path = _partition_path()[0]
    part = _open(path)
    lo, hi = _local_share(part.num_rows)
    cols = _columns(part, columns, lo, hi)
    m = hi - lo
    total = m if num_samples is None else num_samples
    nbatches = total // batch_size if drop_last else -(-total // batch_size)
    perm = None
    if shuffle:
        dtype = np.int32 if hi < 2**31 else np.int64
        perm = np.random.default_rng(seed).permutation(m).astype(dtype) + lo
    return _batches(path, cols, lo, m, total, batch_size, nbatches, perm)


def _batches(path: str, cols: List[_Column], lo: int, m: int, total: int, batch_size: int,
             nbatches: int, perm: Optional[np.ndarray]) -> Iterator[Dict[str, Any]]:
    part = _open(path)
    w, nw = _worker()
    if perm is not None:
        for j in range(w, nbatches, nw):
            rows = perm[np.arange(j * batch_size, min(total, (j + 1) * batch_size)) % m]
            yield {c.name: _tensor(_take_rows(part, c, rows)) for c in cols}
        return
    # In order, a batch almost always lies inside one record batch; when every column of
    # that record batch is a view, the batch is one ndarray slice and one from_numpy per
    # column (~0.6 us each), with the record batch's views looked up once, not per batch:
    # at 1024 rows of 4 floats the general path's per-batch planning cost as much as
    # reading the batch. Batches that span record batches or wrap around take _plan.
    starts, from_numpy = part.starts, torch.from_numpy
    i, end_i, views = -1, -1, None
    stride = nw * batch_size  # rows from one of this worker's batches to its next
    j = w
    while j < nbatches:
        s0 = j * batch_size
        n = min(total - s0, batch_size)
        a = s0 % m
        row = lo + a
        if a + n <= m:
            if not (i >= 0 and starts[i] <= row < end_i):
                i = part.locate(row)
                end_i = starts[i + 1]
                views = _views_of(cols, i)
            if views is not None and row + n <= end_i:
                # This batch and the next ones of this worker that lie in this record
                # batch, are full and do not wrap around: a run of plain slices.
                count = 1
                if n == batch_size:
                    count += min((min(end_i, lo + m) - row - n) // stride,
                                 (total - s0 - n) // stride, (nbatches - 1 - j) // nw)
                first = row - starts[i]
                for off in range(first, first + count * stride, stride):
                    stop = off + n
                    batch = {}
                    for name, v in views:
                        batch[name] = from_numpy(v[off:stop])
                    yield batch
                j += count * nw
                continue
        plan = _plan(part, list(_ranges(s0, s0 + n, lo, m)))
        yield {c.name: _tensor(_slice_rows(c, plan)) for c in cols}
        j += nw


def _views_of(cols: List[_Column], i: int) -> Optional[List[Tuple[str, np.ndarray]]]:
    """(name, the view of record batch i) of every column, or None when a column of that
    record batch needs converting."""
    views = []
    for c in cols:
        p = c.parts[i]
        if p is None or p.view is None:
            return None
        views.append((c.name, p.view))
    return views


class _SparkPartitionDataset(torch.utils.data.IterableDataset):
    """PySpark's _SparkPartitionTorchDataset, read from Arrow columns: the first
    num_samples rows of this process's share (wrapping around), already collated into
    batches: a list per batch with one ndarray per column, of PySpark's dtypes."""

    def __init__(self, path: str, schema_file: Optional[str], num_samples: int,
                 batch_size: int) -> None:
        part = _open(path)
        types = _spark_types(part, schema_file)
        for t in types:
            if t not in _STOCK_DTYPES:
                raise ValueError("SparkPartitionTorchDataset does not support loading data from "
                                 f"field of type {t}.")
        self.path, self.num_samples, self.batch_size = path, max(0, num_samples), batch_size
        self.dtypes = [np.dtype(_STOCK_DTYPES[t]) for t in types]
        self.lo, self.hi = _local_share(part.num_rows)
        _columns(part, None, self.lo, self.hi)  # nulls and ragged arrays fail here, not later

    def __len__(self) -> int:
        return -(-self.num_samples // self.batch_size)

    def __iter__(self) -> Iterator[List[Any]]:
        part = _open(self.path)
        cols = _columns(part, None, self.lo, self.hi)
        m, n, b = self.hi - self.lo, self.num_samples, self.batch_size
        w, nw = _worker()
        for j in range(w, len(self), nw):
            plan = _plan(part, list(_ranges(j * b, min(n, (j + 1) * b), self.lo, m)))
            yield [_Rows(plan) if _is_view(c, plan, dt) else np.asarray(_slice_rows(c, plan), dtype=dt)
                   for c, dt in zip(cols, self.dtypes, strict=True)]


class _Rows:
    """Rows of a column that the consuming process reads from its own mapping of the
    file (already PySpark's dtype, views of the file): what a worker sends instead of
    their bytes, as a shared-memory segment's handle is sent instead of its contents."""

    __slots__ = ("plan",)

    def __init__(self, plan: List[Tuple[int, int, int]]) -> None:
        self.plan = plan


def _is_view(col: _Column, plan: List[Tuple[int, int, int]], dtype: np.dtype) -> bool:
    return col.dtype == dtype and all(col.parts[i].view is not None for i, _, _ in plan)  # type: ignore[union-attr]


def _as_is(batch: Any) -> Any:
    return batch


class _PartitionLoader(torch.utils.data.DataLoader):
    """A DataLoader whose workers send converted columns as ndarrays (pickled through the
    worker's pipe: at these sizes far cheaper than a shared-memory segment and a file
    descriptor per tensor) and columns that are views of the file as row ranges; here, in
    the consuming process, both become tensors without a copy."""

    def __iter__(self) -> Iterator[List[Any]]:  # type: ignore[override]
        ds = self.dataset
        cols: Optional[List[_Column]] = None
        for batch in super().__iter__():
            out = []
            for k, x in enumerate(batch):
                if isinstance(x, _Rows):
                    if cols is None:
                        cols = _columns(_open(ds.path), None, ds.lo, ds.hi)  # type: ignore[attr-defined]
                    x = _slice_rows(cols[k], x.plan)
                out.append(torch.from_numpy(x))
            yield out


def get_spark_partition_data_loader(num_samples: int, batch_size: int, num_workers: int = 1,
                                    prefetch_factor: int = 2) -> Any:
    """PySpark's ``_get_spark_partition_data_loader``, read from Arrow columns.

    Must be called inside the train function of ``TorchDistributor.train_on_dataframe``.
    The loader yields the first num_samples rows of this process's rows of its partition
    (wrapping around to the first row when num_samples is larger), in batches of
    batch_size, each a list with one tensor per column, of PySpark's dtypes: float, double
    -> float64; int, bigint, smallint -> int64; array<T> -> 2-D of T's dtype; ML vectors
    -> float64 2-D. Unlike PySpark's, several workers may load (each reads its own
    batches; the order is the same as with one), and ``len(loader)`` is the number of
    batches. The DataLoader's ``batch_size`` attribute is None: the dataset yields whole
    batches.
    """
    _check_sizes(batch_size, None)
    path, schema_file = _partition_path()
    dataset = _SparkPartitionDataset(path, schema_file, num_samples, batch_size)
    if num_workers > 0:
        return _PartitionLoader(dataset, batch_size=None, num_workers=num_workers,
                                prefetch_factor=prefetch_factor, collate_fn=_as_is)
    # With no worker, DataLoader refuses any prefetch_factor (as in PySpark).
    return _PartitionLoader(dataset, batch_size=None, num_workers=num_workers, collate_fn=_as_is)
