"""The HTTP layer: the slow-client guard under the ASGI app (guard) and per-request helpers (context)."""

from glassbox.service.http.guard import ABORT_REASONS, AbortReason, GuardLimits, guarded_protocol

__all__ = ["ABORT_REASONS", "AbortReason", "GuardLimits", "guarded_protocol"]
