"""Data sets: readers for the data specs, one in-memory representation, TFDS builders."""
