"""How results are shown: terminal tables now; HTML and plots later."""
