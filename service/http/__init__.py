"""The HTTP protocol layer under the ASGI app: the slow-client guard."""

from service.http.guard import ABORT_REASONS, AbortReason, GuardLimits, guarded_protocol

__all__ = ["ABORT_REASONS", "AbortReason", "GuardLimits", "guarded_protocol"]
