"""One caching rule for every encoding: tables are built once per key unless gradients must reach them."""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable

import torch

from ._compat import is_compiling
from .sharding import any_sharded


MAX_TABLE_BYTES = 64 * 2**20  # larger tables are rebuilt per call: a 4096-token (heads, T, T) bias is 400 MB


def nbytes(table) -> int:
    """Bytes held by a table: a tensor, or a tuple/list of tensors."""
    if isinstance(table, torch.Tensor):
        return table.numel() * table.element_size()
    return sum(nbytes(t) for t in table) if isinstance(table, (tuple, list)) else 0


class TableCache:
    """A small LRU of computed tables (position vectors, rotations, biases, indices).

    ``get(key, build, params)`` returns ``build()`` for ``key``. When any of ``params`` requires grad and
    autograd is on, the table is rebuilt every call so gradients flow into it (training a learned table);
    otherwise the tables are kept while ``params`` stay what they were when the tables were built
    (:class:`ParameterWatch`): an optimizer step, ``load_state_dict``, ``p.data.mul_()`` or ``p.data = ...`` empties
    the cache. Under ``torch.compile`` the table is built inside the graph (no Python dictionary lookups to guard on).
    A table built while any of ``params`` is a sharded DTensor (FSDP2, outside the forward that gathers them:
    :mod:`visionpe.sharding`) is returned but not kept, and the watch never sees a shard: what is kept was computed
    from whole parameters, which the watch compares at the next lookup.
    A table of more than ``max_bytes`` is returned but not kept, so at large grids (4096 tokens and more) each
    block's ``(heads, T, T)`` bias lives only while its attention runs instead of one per block for the model's
    lifetime; ``max_bytes=None`` keeps every table (a module or cache shared by all blocks: one table in all).
    The cache is not part of the state dict.
    """

    def __init__(self, maxsize: int = 8, max_bytes: int | None = MAX_TABLE_BYTES):
        self.maxsize, self.max_bytes = maxsize, max_bytes
        self._tables: OrderedDict = OrderedDict()
        self._watch = ParameterWatch()
        self._lock = threading.Lock()  # concurrent forwards share caches: lookups and evictions are atomic

    def get(self, key: Hashable, build: Callable[[], torch.Tensor], params: Iterable[torch.Tensor] = ()):
        params = tuple(params)
        if is_compiling() or (torch.is_grad_enabled() and any(p.requires_grad for p in params)) or any_sharded(params) \
                or any(p.is_meta for p in params):
            return build()  # traced into the compiled graph (a function of shapes only), gradients must flow, shards,
            # or parameters without values (the meta device: nothing to watch)
        with self._lock:
            if params and self._watch.changed(params):
                self._tables.clear()  # every table was built from the old values
            if key in self._tables:
                self._tables.move_to_end(key)
                return self._tables[key]
        # outside the lock: two threads may build the same table, both correct; a table built under
        # torch.inference_mode() would be an inference tensor that a later forward with autograd cannot save for its
        # backward, so it is built as an ordinary tensor (without grad: it is kept)
        with torch.inference_mode(False), torch.no_grad():
            table = build()
        if self.max_bytes is None or nbytes(table) <= self.max_bytes:
            with self._lock:
                self._tables[key] = table
                if len(self._tables) > self.maxsize:
                    self._tables.popitem(last=False)
        return table

    def __deepcopy__(self, memo) -> "TableCache":
        return TableCache(self.maxsize, self.max_bytes)  # a copied module starts with an empty cache

    def __getstate__(self) -> dict:
        return {"maxsize": self.maxsize, "max_bytes": self.max_bytes}  # tables and lock are not pickled

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def tables(self) -> list:
        """The tables held now (for memory reports)."""
        with self._lock:
            return list(self._tables.values())

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()


class ParameterWatch:
    """Whether parameters still hold the values they had when last seen.

    A parameter's version counter (``p._version``) misses writes through ``p.data``: ``p.data.mul_()`` bumps the
    counter of the tensor ``.data`` returns, a new one at every access, not the parameter's; ``p.data = other`` swaps
    the storage and keeps the version. So the watch keeps a copy of each parameter and compares values
    (``torch.equal``: one pass over the parameter per lookup; on an accelerator a sync): any write counts, however it
    was made, and an equal value (``p.data = p.data.clone()``) keeps the tables.
    """

    def __init__(self):
        self._seen: dict[int, torch.Tensor] = {}  # id(p) -> a copy of its values when last seen

    def changed(self, params: tuple[torch.Tensor, ...]) -> bool:
        """True (and remember the new values) when any of ``params`` is new to the watch or differs from when it was
        last seen."""
        changed = False
        for p in params:
            seen = self._seen.get(id(p))
            if seen is None or (seen.shape, seen.dtype, seen.device) != (p.shape, p.dtype, p.device) \
                    or not torch.equal(p, seen):
                self._seen[id(p)] = p.detach().clone()
                changed = True
        return changed
