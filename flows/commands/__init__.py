"""CLI commands, one module each; flows/cli.py registers them."""
