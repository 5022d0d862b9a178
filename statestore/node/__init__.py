"""The node daemon: HTTP API, coordinator, relay hops, repair, compaction, storage and
discovery. Nothing below this layer imports it; the client never does."""
