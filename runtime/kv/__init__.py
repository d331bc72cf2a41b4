"""KV memory: the paged pool (pool.py), the decode mirror (mirror.py), and the KV manager (manager.py), the only
door to the radix tree: admission, in-flight commits, growth, pins (pins.py), retention (retention.py), release."""
