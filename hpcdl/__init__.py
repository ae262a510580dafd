"""hpcdl: train PyTorch models on Slurm GPU clusters from one command.

Nothing is imported here on purpose: the login-node path must stay free of torch.
"""

__version__ = "0.1.0"
