"""The engine: continuous batching over a backend's graphs. `engine.Engine` steps a `scheduler.Scheduler`
of `sequence.Sequence`s; `sampling` picks each row's token; `detokenizer` and `stops` turn tokens into
text; `params` and `events` are the values in and out; `loop.EngineLoop` is the one thread that drives
it in a server. Imports backends and model, never the other way round."""
