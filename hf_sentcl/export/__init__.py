"""Leaving the toolkit: the export folder, its checks, the model card, MTEB result files and the push."""
