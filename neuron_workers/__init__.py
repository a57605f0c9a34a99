"""Runtime worker for Gemma-4 text models: checkpoint loading, the static-shape graph modules,
host-side embeddings and sampling, backends and the decode-loop engine.

Nothing here imports Ray or a Neuron package; the Neuron backend is imported only by
`neuron_workers.backends.get_backend("neuron")`.
"""
