"""Every format that crosses a process boundary or lands on disk: typed, versioned and
validated once at decode (row framing, recovery frames, manifests, message bodies, headers)."""
