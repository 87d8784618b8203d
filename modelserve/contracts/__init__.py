"""What the programs agree on, and nothing else: names, labels, settings and their environment
variables. Standard library only, so any program may import it without loading a framework."""
