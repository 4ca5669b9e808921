"""What-if studies: YAML base + overrides + sweeps -> many independent runs."""
