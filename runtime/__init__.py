"""runtime: a PyTorch inference runtime that prefills only what the radix cache lacks."""
