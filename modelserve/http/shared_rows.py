"""Counts a pod's workers (workers.py) share: a row of 64-bit integers per worker, in memory mapped
before the fork, so every worker reads every row at the cost of a memory read.

Each row has one writer, its worker, so nothing is locked: a reader sums the rows and may miss a
change made at that instant. A limit checked this way can let through one request more per other
worker at once, the bound `share()` already allows across replicas. A worker clears its row as it
starts, so what a dead worker held is given back when it is started again."""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Sequence


class SharedRows:
    def __init__(self, rows: int, width: int) -> None:
        self.rows = rows
        self.width = width
        # Anonymous and shared (mmap's default flags): the forked workers see the same pages.
        self._cells = memoryview(mmap.mmap(-1, max(1, rows * width) * 8)).cast("q")

    def row(self, index: int) -> memoryview:
        """Row `index`'s cells, to read, or to write by its worker only."""
        return self._cells[index * self.width : (index + 1) * self.width]

    def clear(self, index: int) -> None:
        row = self.row(index)
        for cell in range(self.width):
            row[cell] = 0


def name_hash(name: str) -> int:
    """The same in every worker (str's hash is salted per process), and never 0 (an empty entry)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True) or 1


class Names:
    """Counts by name in the rows, from cell `start` on: `capacity` entries of a name's hash and its
    `fields` counts, placed by open addressing. This worker writes its own row's entries; it finds a
    name's entries in the others' rows by the same probe."""

    def __init__(self, rows: SharedRows, own: int, start: int, capacity: int, fields: int) -> None:
        assert start + capacity * (1 + fields) <= rows.width
        self.own = rows.row(own)
        self.others = [rows.row(index) for index in range(rows.rows) if index != own]
        self.start = start
        self.capacity = capacity
        self.fields = fields
        self.entries: dict[str, int] = {}  # name -> the cell its entry starts at, in this row
        self.hashes: dict[str, int] = {}
        self.forgotten: set[int] = set()  # entries of names forgotten, to reuse
        self.full = False  # a name found no entry in this row (until one is forgotten)

    @staticmethod
    def width(capacity: int, fields: int) -> int:
        return capacity * (1 + fields)

    def publish(self, name: str, counts: Sequence[int], first: int = 0) -> bool:
        """`name`'s counts in this worker (from field `first` on), for the others to read; False when
        this row has no room for one more name (then it is not shared)."""
        at = self.entries.get(name)
        if at is None:
            at = self._place(name)
            if at is None:
                self.full = True
                return False
        own = self.own
        for field, count in enumerate(counts, at + 1 + first):
            own[field] = count
        return True

    def elsewhere(self, name: str) -> list[list[int]] | None:
        """`name`'s counts in each other worker that has them; None when this row may have no room
        for it (then the others may not share theirs either)."""
        if self.full and name not in self.entries:
            return None
        wanted = self._hash(name)
        found = []
        for row in self.others:
            at = self._find(row, wanted)
            if at is not None:
                found.append([row[field] for field in range(at + 1, at + 1 + self.fields)])
        return found

    def forget(self, name: str) -> None:
        """`name` no longer counts here: its entry is free for another. Its hash stays until then, so
        the entries placed after it on the same probe are still found."""
        at = self.entries.pop(name, None)
        self.hashes.pop(name, None)
        if at is not None:
            self._zero(at)
            self.forgotten.add(at)
            self.full = False

    def _hash(self, name: str) -> int:
        value = self.hashes.get(name)
        if value is None:
            value = self.hashes[name] = name_hash(name)
        return value

    def _entry(self, wanted: int, step: int) -> int:
        return self.start + ((wanted + step) % self.capacity) * (1 + self.fields)

    def _zero(self, at: int) -> None:
        for field in range(at + 1, at + 1 + self.fields):
            self.own[field] = 0

    def _place(self, name: str) -> int | None:
        """An entry for `name` in this row: its own old one, an empty one or a forgotten one, the first
        on its probe (where every reader looks before an empty entry ends the search)."""
        wanted = self._hash(name)
        own = self.own
        for step in range(self.capacity):
            at = self._entry(wanted, step)
            if own[at] in (0, wanted) or at in self.forgotten:
                self.forgotten.discard(at)
                self._zero(at)
                own[at] = wanted  # last: a reader finds the entry with its counts already zero
                self.entries[name] = at
                return at
        return None

    def _find(self, row: memoryview, wanted: int) -> int | None:
        """Where `wanted`'s entry starts in another worker's row, or None."""
        for step in range(self.capacity):
            at = self._entry(wanted, step)
            found = row[at]
            if found == wanted:
                return at
            if found == 0:
                return None
        return None
