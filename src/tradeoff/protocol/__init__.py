"""Wire formats: the Open Inference Protocol v2 (JSON and binary tensor extension)."""
