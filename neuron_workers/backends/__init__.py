"""The backend boundary: what runs the graph modules. Chosen once, when an engine is built.

`cpu.CpuBackend` runs the graphs in this process (eager, strict torch.export programs or inductor);
`cpu_tp.TpCpuBackend` runs them sharded over torch.distributed ranks (gloo); `neuron.NeuronBackend` runs
graphs compiled by neuronx-cc through NxD. All share `base.GraphBackend`. Only
`neuron_workers.backends.neuron*` may import Neuron packages, and only when that backend is asked for.
"""

from neuron_workers.backends.base import Backend, GraphBackend

__all__ = ["Backend", "GraphBackend"]
