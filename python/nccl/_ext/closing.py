"""The context-manager half of the objects that own a library resource and free it in close()."""

from __future__ import annotations


class Closing:
    """`with obj:` closes obj at the end of the block (exceptions pass through); the class defines close()."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False
