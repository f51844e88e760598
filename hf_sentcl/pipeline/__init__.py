"""The pipeline of a run: build the encoder and data, evaluate, train, save, export; and sweeps of runs."""
