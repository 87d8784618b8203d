"""modelserve: the command line (render, create from a Modelfile, list, show, run, rm), on a laptop."""
