"""The model side: checkpoint reading and loading (`checkpoint`, `loader`), shape facts (`dims`), the
declared graph inputs and outputs (`spec`), the static-shape graph modules (`graphs`, `attention`) and
the stateful module Neuron-shaped backends trace (`graph_model`), plus the host-side inputs those graphs
take (`host_inputs`, `ple`). Nothing here knows about requests or batching policy."""
