"""The GPU side: everything that loads model weights (trainer and inference serving)."""
