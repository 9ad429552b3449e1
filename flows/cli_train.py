"""Placeholder until its issue lands; registers no commands yet."""
