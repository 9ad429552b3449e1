"""Checkpoints: the files and their manifest, the manager a run saves and resumes through, the background
writer, the folder's lock, and loading a model from one.
"""
