"""Telemetry: turns what happened into metrics, traces and logs. Nothing in service/ imports it."""
