"""modelserve."""
