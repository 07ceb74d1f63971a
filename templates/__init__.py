"""Jinja2 templates that emit linalg/HAL MLIR, one template per kernel family."""
