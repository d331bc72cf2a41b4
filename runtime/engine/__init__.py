"""The engine: the public `Engine` (engine.py) and the parts it builds: the scheduler (what each step runs), the
model runner (one forward pass per step), the output processor (sampling, stops, results), the loop thread,
requests and sessions. The scheduler is given the runner, the KV manager and the output processor; it never sees
the Engine."""
