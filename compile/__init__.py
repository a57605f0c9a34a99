"""Offline compile step: `python -m compile build` traces the prefill buckets, the decode graphs and (neuron)
the extend graphs of chunked prefill and speculative verify into artifacts with a manifest (for one model, or
for every model of a serve config); `python -m compile plan` checks that a model fits the NeuronCores' HBM;
`python -m compile smoke` is the inf2 hardware smoke test. It writes artifacts; reading and checking them is
the runtime's (`neuron_workers.artifacts.manifest`, `.artifacts`). Import as `from compile import ...` (the
bare name shadows the builtin `compile`)."""
