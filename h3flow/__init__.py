"""h3flow: a MiniMax H3 image-to-video factory over heterogeneous home-lab GPUs, run by Prefect."""

__version__ = "0.1.0"
