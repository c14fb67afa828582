from glassbox.service.engines.base import Engine

__all__ = ["Engine"]
