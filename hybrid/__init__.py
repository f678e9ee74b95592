"""Torch modules built on qnodes."""
