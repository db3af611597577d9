"""The built-in trainer: torchvision models and datasets, the DDP training loop."""
