"""Batched, length-sorted, resumable generation of predictions."""
