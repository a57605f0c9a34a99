"""Runtime worker for Gemma-4 text models: checkpoint loading, the static-shape graph modules,
host-side embeddings and sampling, backends and the decode-loop engine.

Nothing here imports Ray. Neuron packages are imported only inside `neuron_workers.backends.neuron*`,
and only when the neuron backend is asked for (building or loading Neuron artifacts).
"""
