"""Scaling: the law the loss follows in parameters and tokens, fitted to measured runs, and the run a
compute budget buys under it."""
