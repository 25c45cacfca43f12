"""One caching rule for every encoding: tables are built once per key unless gradients must reach them."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable

import torch


class TableCache:
    """A small LRU of computed tables (position vectors, rotations, biases, indices).

    ``get(key, build, params)`` returns ``build()`` for ``key``. When any of ``params`` requires grad and
    autograd is on, the table is rebuilt every call so gradients flow into it (training a learned table);
    otherwise the parameters' versions join the key, so an optimizer step or ``load_state_dict`` invalidates
    it. Under ``torch.compile`` the table is built inside the graph (no Python dictionary lookups to guard on).
    The cache is not part of the state dict.
    """

    def __init__(self, maxsize: int = 8):
        self.maxsize = maxsize
        self._tables: OrderedDict = OrderedDict()

    def get(self, key: Hashable, build: Callable[[], torch.Tensor], params: Iterable[torch.Tensor] = ()):
        params = tuple(params)
        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(p.requires_grad for p in params)):
            return build()  # traced into the compiled graph (a function of shapes only), or gradients must flow
        key = (key, tuple(p._version for p in params))
        if key in self._tables:
            self._tables.move_to_end(key)
            return self._tables[key]
        table = self._tables[key] = build()
        if len(self._tables) > self.maxsize:
            self._tables.popitem(last=False)
        return table

    def clear(self) -> None:
        self._tables.clear()
