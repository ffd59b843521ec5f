"""Model repository: discovery, configuration (pbtxt/YAML), auto-complete, versions."""
