"""Load generation and measurement against inference endpoints."""
