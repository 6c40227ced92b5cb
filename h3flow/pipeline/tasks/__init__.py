"""The pipeline's stages as Prefect tasks: cached on content hashes, retried on transient failures."""
