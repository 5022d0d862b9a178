"""The pure core: names, placement, quorum rules, the chunk codec, manifests, plans and the
decisions of repair, retention and membership. No sockets, no clock, no asyncio: plain
functions over plain data, tested with tables, data files and properties."""
