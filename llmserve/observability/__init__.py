"""Metrics (through Ray's pipeline) and traces (OpenTelemetry) that every role emits."""
