"""Enum-keyed registries of policy classes (STYLE 12: vidur's registry shape, gguf-py's duplicate assert).

Each policy family (share strategy, expert chooser, chunk planner, ...) owns one ``Registry``; a class joins
it with ``@REG.register(Kind.X)``. Registering a key twice is a programming error and fails at import time.
"""

from __future__ import annotations

from enum import Enum
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, family: str, keys: type[Enum]):
        self.family = family
        self.keys = keys
        self._classes: dict[Enum, type[T]] = {}

    def register(self, key: Enum) -> Callable[[type[T]], type[T]]:
        if not isinstance(key, self.keys):
            raise TypeError(f"{self.family}: key {key!r} is not a {self.keys.__name__}")

        def add(cls: type[T]) -> type[T]:
            if key in self._classes:
                raise ValueError(
                    f"{self.family}: {key} registered twice ({self._classes[key].__name__} "
                    f"and {cls.__name__})"
                )
            self._classes[key] = cls
            return cls

        return add

    def get(self, key: Enum) -> type[T]:
        try:
            return self._classes[key]
        except KeyError:
            known = ", ".join(str(k) for k in self._classes)
            raise KeyError(f"{self.family}: no policy registered for {key} (known: {known})") from None

    def create(self, key: Enum, *args, **kw) -> T:
        return self.get(key)(*args, **kw)

    def __contains__(self, key: Enum) -> bool:
        return key in self._classes

    def registered(self) -> list[Enum]:
        return list(self._classes)
