"""The durable run store (diskcache, JSON only) and its run locks."""
