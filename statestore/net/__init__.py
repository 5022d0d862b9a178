"""Talking to the ring: the ``Transport`` seam, its HTTP and in-memory implementations, and
what runs over it for any caller (quorum reads, replicated writes, the restorer)."""
