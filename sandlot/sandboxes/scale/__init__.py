"""How sandboxes start at scale: the STARTING cap (per process, and cluster-wide through a Ray
actor), start retries within a wall budget, and the one backoff every backend retries with."""
