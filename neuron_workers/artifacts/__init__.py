"""Compiled artifacts: the manifest `compile build` writes (`manifest`) and serving from them (`load`)."""
