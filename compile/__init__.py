"""Offline compile step: `python -m compile build` traces the prefill buckets and the decode graph into
artifacts with a manifest; `python -m compile plan` checks that a model fits the NeuronCores' HBM.
Import as `from compile import ...` (the bare name shadows the builtin `compile`)."""
