"""Operations on the cluster's hosts: patches, services, preflight."""
