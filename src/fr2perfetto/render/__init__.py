"""Render: one file per output. ``perfetto`` (with ``wire``, the protobuf encoding) and ``chrome_json``
write traces; ``terminal``, ``markdown`` and ``report`` (the JSON report) write the analysis."""
