"""Engines do the GPU work of a stage; the flows do not care which one runs."""
