"""The engine: the public `Engine` (engine.py), built from one validated `EngineConfig` (engine_config.py), taking
one `RequestOptions` per request (options.py), and the parts it builds: the scheduler (what each step runs), the
model runner (one forward pass per step), the output processor (sampling, stops, results), the loop thread,
requests and sessions. The scheduler is given the runner, the KV manager and an output processor; it never sees
the Engine. `protocol.GenerationEngine` is what the server, the replay and the CLI need of an engine."""
