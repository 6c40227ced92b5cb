"""Prefect flows: ``sample-clip`` (sampler pools), ``decode-clip`` (decoders), ``batch`` (the dispatcher)."""
