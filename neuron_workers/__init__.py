"""Runtime worker for Gemma-4 text models. Subpackages, in the order a request meets them going down:

  engine/     continuous batching: engine, scheduler, sequences, sampling, detokenizer, stops, loop thread
  backends/   what runs the graphs: cpu, cpu_tp (gloo), xla (torch-xla), neuron (NxD), all on
              `backends.base.GraphBackend`
  model/      checkpoint loading, dims, graph specs, graph modules, host inputs, the PLE table
  parallel/   tensor parallelism: shard plan, collectives, TP layers
  artifacts/  the compiled-artifact manifest and serving from artifacts
  testing/    tiny random-weight checkpoints (tests and the local default)

`config.EngineConfig` is the one schema of a model's engine settings; `factory.build_engine` turns it into
an Engine; `generate` is the CLI. Nothing here imports Ray. Neuron packages are imported only inside
`neuron_workers.backends.neuron*`, and only when the neuron backend is asked for.
"""
