"""Network layer: accepting connections, framing requests into pooled buffers, writing responses in order."""
